"""`approval-broker`: run the fleet's roles and operate the broker from a shell.

This module is the typer app and the entry point only; each command lives in the module of its
concern (`cli_roles`, `cli_requests`, `cli_dead_letters`, `cli_tokens`, `cli_rules`, `cli_ops`,
`cli_audit`), and what
they share in `cli_common`. Errors print one line and exit non-zero; `--help` works on every
command.
"""

from __future__ import annotations

import sys
from importlib.metadata import version
from typing import Annotated

import typer

from approval_broker import cli_dead_letters, cli_mcp, cli_ops, cli_requests, cli_roles, cli_stats
from approval_broker.cli_audit import audit_app
from approval_broker.cli_channels import channels_app
from approval_broker.cli_rules import rules_app
from approval_broker.cli_tokens import token_app
from approval_broker.exit_with_up import watch_for_up_exit

app = typer.Typer(
    help="A queue-backed approval broker for AI agents: requests wait for a person, runs resume.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(token_app, name="token")
app.add_typer(rules_app, name="rules")
app.add_typer(audit_app, name="audit")
app.add_typer(channels_app, name="channels")
app.add_typer(cli_ops.config_app, name="config")
app.add_typer(cli_ops.runs_app, name="runs")
app.add_typer(cli_ops.webhook_app, name="webhook")


def show_version(value: bool) -> None:
    if value:
        typer.echo(f"approval-broker {version('approval-broker')}")
        raise typer.Exit()


@app.callback()
def options(
    _version: Annotated[
        bool,
        typer.Option(
            "--version", callback=show_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """A queue-backed approval broker for AI agents: requests wait for a person, runs resume."""


for command in (
    cli_roles.up,
    cli_roles.api,
    cli_roles.worker,
    cli_roles.resumer,
    cli_roles.notifier,
    cli_roles.sweeper,
    cli_requests.pending,
    cli_requests.decide,
    cli_ops.status,
    cli_stats.stats,
):
    app.command()(command)
app.command("dead-letters")(cli_dead_letters.dead_letters)
app.command("redrive")(cli_dead_letters.redrive)
app.command("mcp-gateway")(cli_mcp.mcp_gateway)


def main() -> None:
    watch_for_up_exit()
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
