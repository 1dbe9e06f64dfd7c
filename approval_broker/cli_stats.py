"""`approval-broker stats`: how approvals went over a window, in the terminal.

The same figures as `GET /v1/stats` (`broker.domain.insights`), read from the rollups in the
broker's Redis: the shell is the operator, so it sees every request and the per-approver
counts. A bad window is one line and a non-zero exit.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from approval_broker.cli_common import DataDir, clear_errors, connect
from broker.domain.insights import summarize, window


def stats(
    since: Annotated[
        str | None, typer.Option(help="From this ISO 8601 time (no zone: UTC; default 24 h ago).")
    ] = None,
    until: Annotated[
        str | None, typer.Option(help="Until this ISO 8601 time (default now).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="The /v1/stats JSON.")] = False,
    data_dir: DataDir = None,
) -> None:
    """Requests by outcome, queue, tool and agent, who decided, time to decision, escalations,
    rule hits and reject reasons over a window (at most a year), counted by the hour."""
    broker = connect(data_dir)
    with clear_errors():
        insights = broker.insights
        start, end = window(since, until, insights.now())
        counters, start, end = insights.counters(start, end)
        body = summarize(counters, lambda cell: True, people=True, since=start, until=end)
    if as_json:
        typer.echo(json.dumps(body, indent=2))
        return
    for line in summary_lines(body):
        typer.echo(line)


def summary_lines(s: dict[str, Any]) -> list[str]:
    """The stats as a few lines a person reads top to bottom."""
    r = s["requests"]
    out = [f"{s['since'][:16].replace('T', ' ')} – {s['until'][:16].replace('T', ' ')} UTC"]
    out.append(f"requests created: {r['total']}")
    for name in ("by_outcome", "by_queue", "by_tool", "by_agent"):
        if r[name]:
            out.append(f"  {name.replace('_', ' ')}: {_pairs(r[name])}")
    out.append(f"decided by: {_pairs(s['decided_by'])}")
    ttd = s["time_to_decision_s"]
    out.append(f"time to decision: p50 {_seconds(ttd['p50'])}, p90 {_seconds(ttd['p90'])}")
    for queue, p in ttd["by_queue"].items():
        out.append(f"  {queue}: p50 {_seconds(p['p50'])}, p90 {_seconds(p['p90'])}")
    out.append(f"escalations: {s['escalations']}")
    if s["rule_hits"]:
        out.append(f"rule hits: {_pairs(s['rule_hits'])}")
    if s["reject_reasons"]:
        out.append("reject reasons:")
        out += [f"  {x['count']:>5}  {x['reason']}" for x in s["reject_reasons"]]
    if s["by_approver"]:
        out.append(f"answers per approver: {_pairs(s['by_approver'])}")
    return out


def _pairs(table: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in table.items()) or "none"


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 120:
        return f"{value:g} s"
    if value < 7200:
        return f"{value / 60:.1f} min"
    return f"{value / 3600:.1f} h"
