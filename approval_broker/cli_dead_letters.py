"""Dead letters from the shell: `dead-letters` lists them (and may re-drive), `redrive` re-drives.

A dead letter is a delivery or an entry that could not be handled; re-driving puts it back on
the stream it came from. One that came from no stream is left as is.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer

from approval_broker.cli_common import DataDir, clear_errors, connect


def dead_letters(
    count: Annotated[int, typer.Option(help="How many to show.")] = 100,
    redrive_all: Annotated[
        bool,
        typer.Option("--redrive", help="Also put every listed one back on its stream."),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
    data_dir: DataDir = None,
) -> None:
    """List dead letters: deliveries and entries that could not be handled, with their cause."""
    broker = connect(data_dir)
    with clear_errors():
        rows = broker.dead_letters(count)
    if not rows and not as_json:
        typer.echo("no dead letters")
    for entry_id, fields in rows:
        if as_json:
            typer.echo(json.dumps({"id": entry_id, **fields}))
            continue
        what = " ".join(x for x in (fields.get("f.type"), fields.get("f.request_id")) if x)
        typer.echo(
            f"{entry_id}  {fields.get('at', '?')[:19]}  {fields.get('source', '?')}"
            f"{'  ' + what if what else ''}: {fields.get('error', '?')}"
        )
    if redrive_all:
        with clear_errors():
            for entry_id, fields in rows:
                if fields.get("stream"):
                    broker.redrive(entry_id)
                    typer.echo(f"{entry_id}: re-driven")
                else:
                    typer.echo(f"{entry_id}: not from a stream; left as is")


def redrive(
    entry_ids: Annotated[
        list[str], typer.Argument(metavar="ENTRY_ID...", help="Dead letters to put back.")
    ],
    data_dir: DataDir = None,
) -> None:
    """Put dead letters back on the stream they came from, to be handled again."""
    broker = connect(data_dir)
    with clear_errors():
        for entry_id in entry_ids:
            broker.redrive(entry_id)
            typer.echo(f"{entry_id}: re-driven")
