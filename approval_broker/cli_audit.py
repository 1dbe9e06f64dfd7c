"""`approval-broker audit export|verify`: the audit trail out of Redis, and checked.

`export` writes one JSON entry per line, chain by chain, each chain in order; `verify` checks
a file (or, with none, the chains in Redis, and that each ends at its head) and exits 0 when
every chain is whole, 1 naming the first entry changed, removed or reordered.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from approval_broker.cli_common import DataDir, clear_errors, connect, fail
from broker.audit.chain import Entry, Problem, parse_line, verify
from broker.audit.trail import AuditTrail

audit_app = typer.Typer(
    help="The tamper-evident audit trail: export it, verify it.", no_args_is_help=True
)

When = Annotated[
    str | None,
    typer.Option(help="ISO 8601 date or time (UTC when it names no zone), e.g. 2026-12-01."),
]


def parse_when(text: str | None, name: str) -> datetime | None:
    """A `--since`/`--until` value as an aware time; a clear error for anything else."""
    if text is None:
        return None
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        fail(f"{name}: not an ISO 8601 date or time: {text!r}")
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def trail_of(data_dir: Path | None) -> AuditTrail:
    broker = connect(data_dir)
    return broker.audit


@audit_app.command("export")
def export(
    since: When = None,
    until: When = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write here (default: stdout).")
    ] = None,
    data_dir: DataDir = None,
) -> None:
    """Write the audit trail as JSONL (one entry per line, chain by chain, in order).

    An export that starts after a chain's first entry (--since, or entries trimmed after
    `[audit] retention_days`) is anchored at its first entry: its `prev` is taken as given.
    """
    start, end = parse_when(since, "--since"), parse_when(until, "--until")
    trail = trail_of(data_dir)
    out = output.open("w", encoding="utf-8") if output else sys.stdout
    try:
        with clear_errors():
            for entry in trail.entries(start, end):
                out.write(entry.model_dump_json() + "\n")
    finally:
        if output:
            out.close()


@audit_app.command("verify")
def verify_cmd(
    file: Annotated[
        Path | None,
        typer.Argument(help="A JSONL export ('-' for stdin); none: the chains in Redis."),
    ] = None,
    data_dir: DataDir = None,
) -> None:
    """Exit 0 when every chain is whole; 1 naming the first entry changed, removed or reordered."""
    if file is None:
        trail = trail_of(data_dir)
        with clear_errors():
            pairs: list[tuple[int, Entry | Problem]] = list(enumerate(trail.entries(), 1))
            heads = trail.heads()
        problem, counts = verify(pairs)
        if problem is None:
            problem = _short_of_head(pairs, heads)
    else:
        try:
            text = sys.stdin.read() if str(file) == "-" else file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            fail(f"cannot read {file}: {exc}")
        lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
        problem, counts = verify([(n, parse_line(n, line)) for n, line in lines])
    if problem is not None:
        typer.echo(f"audit trail NOT whole: {problem}", err=True)
        raise typer.Exit(1)
    chains = ", ".join(f"{name}: {n} entries" for name, n in sorted(counts.items())) or "no entries"
    typer.echo(f"audit trail whole ({chains})")


def _short_of_head(
    pairs: list[tuple[int, Entry | Problem]], heads: dict[str, tuple[int, str]]
) -> Problem | None:
    """In Redis, each chain must end at its head (seq and hash): else its last entries went."""
    last: dict[str, tuple[int, Entry]] = {}
    for n, entry in pairs:
        if isinstance(entry, Entry):
            last[entry.chain] = (n, entry)
    for chain, (seq, digest) in heads.items():
        found = last.get(chain)
        if found is None or found[1].seq != seq or found[1].hash != digest:
            at = found[1].seq if found else 0
            return Problem(
                found[0] if found else 0,
                chain,
                at,
                "removed",
                f"the chain's head is seq {seq}, its last entry is seq {at}",
            )
    return None
