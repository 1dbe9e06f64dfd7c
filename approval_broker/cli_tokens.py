"""`approval-broker token new`: an approver's token, shown once, and the config line for it.

Only the token's sha256 goes in the config; the token itself is printed here and kept nowhere.
"""

from __future__ import annotations

from typing import Annotated

import typer

from approval_broker.cli_common import fail
from broker.domain.principals import hash_token, new_token

token_app = typer.Typer(help="Manage approver tokens.", no_args_is_help=True)


@token_app.command("new")
def token_new(
    name: Annotated[str, typer.Argument(help="The approver's name, as in [approvers.NAME].")],
) -> None:
    """Print a fresh token (once) and the config line that accepts it."""
    if not name.replace("-", "").replace("_", "").isalnum():
        fail(f"approver name {name!r} may hold only letters, digits, '-' and '_'")
    token = new_token()
    typer.echo(f"token for {name} (shown once, keep it secret): {token}")
    typer.echo("add to your config:")
    typer.echo(f"[approvers.{name}]")
    typer.echo(f'token_sha256 = "{hash_token(token)}"')
