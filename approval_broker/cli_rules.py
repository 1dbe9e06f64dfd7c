"""`approval-broker rules list|add|revoke|replay`: the operator's hand on policy rules.

The shell is the operator, so a rule added here may have any scope (as role `policy`).
Bad input prints one line and exits non-zero; nothing is written.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Annotated, Any

import typer

from approval_broker.cli_audit import parse_when
from approval_broker.cli_common import DataDir, clear_errors, connect, fail, json_arg
from broker.audit.replay import replay, requests_in, where
from broker.domain.config import Config
from broker.domain.errors import ConfigError
from broker.domain.rules.config_rules import parse_config_rules
from broker.domain.rules.models import Rule, parse_body
from broker.facade import RuleStore

rules_app = typer.Typer(
    help="Policy rules: always allow or deny matching tool calls, or route them by risk.",
    no_args_is_help=True,
)


def _store(data_dir: Path | None) -> RuleStore:
    return connect(data_dir).requests.rules


def rule_kept(rule: Rule, siblings: tuple[str, ...]) -> str:
    """What `approval-broker decide ID approve --remember N` says of the rule it kept."""
    also = f"; it also decided {', '.join(siblings)}" if siblings else ""
    return f"rule {rule.id} kept: {_line(rule)}{also}"


def _line(rule: Rule) -> str:
    scope = " ".join(f"{k}={v}" for k, v in rule.scope.items()) or "any scope"
    state = f"revoked {rule.revoked_at:%Y-%m-%d %H:%M:%S}Z" if rule.revoked_at else "active"
    if rule.mode == "shadow":
        state += " (shadow: decides nothing)"
    args = f" args={json.dumps(rule.args, sort_keys=True)}" if rule.args else ""
    route = f" {where(rule)}" if rule.route is not None else ""
    if rule.priority is not None:
        route += f" priority={rule.priority}"
    return (
        f"{rule.id}  {rule.effect:<5} {rule.tool}  {scope}{args}{route}  hits={rule.hits}  {state}"
    )


@rules_app.command("list")
def list_rules(
    agent: Annotated[str | None, typer.Option(help="Only rules scoped to this agent.")] = None,
    run_id: Annotated[str | None, typer.Option(help="Only rules scoped to this run.")] = None,
    tool: Annotated[str | None, typer.Option(help="Only rules that apply to this tool.")] = None,
    active: Annotated[
        bool | None, typer.Option("--active/--inactive", help="Only active (or inactive) ones.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
    data_dir: DataDir = None,
) -> None:
    """List rules, newest first (revoked ones too, unless --active)."""
    store = _store(data_dir)
    with clear_errors():
        found = store.list(agent=agent, run_id=run_id, tool=tool, active=active)
    if not found and not as_json:
        typer.echo("no rules")
    for rule in found:
        typer.echo(json.dumps(rule.public()) if as_json else _line(rule))


@rules_app.command("add")
def add_rule(
    effect: Annotated[str, typer.Option(help="allow, deny, or route.")],
    tool: Annotated[str, typer.Option(help="Tool name, or a glob such as 'fs_*'.")],
    agent: Annotated[str | None, typer.Option(help="Only this agent's calls.")] = None,
    run_id: Annotated[str | None, typer.Option(help="Only this run's calls.")] = None,
    queue: Annotated[str | None, typer.Option(help="Only calls for this handler queue.")] = None,
    args: Annotated[
        str | None,
        typer.Option(help='Arg matchers as JSON, e.g. \'{"amount": {"le": 100}}\'.'),
    ] = None,
    reason: Annotated[str | None, typer.Option(help="For deny: what the model is told.")] = None,
    expires_at: Annotated[
        str | None, typer.Option(help="ISO 8601 time, e.g. 2026-12-31T00:00:00Z.")
    ] = None,
    rule_id: Annotated[str | None, typer.Option("--id", help="An id (default: generated).")] = None,
    by: Annotated[str, typer.Option(help="Who creates it, as recorded.")] = "cli",
    mode: Annotated[
        str, typer.Option(help="enforce, or shadow: decides nothing, records what it would.")
    ] = "enforce",
    route: Annotated[
        str | None,
        typer.Option(
            help='For route: what it sets, as JSON, e.g. \'{"queue": "finance", "quorum": 2,'
            ' "risk": "high"}\' (also timeout_s, on_timeout: reject|escalate).'
        ),
    ] = None,
    priority: Annotated[
        int | None, typer.Option(help="For route: the highest wins among matching routes.")
    ] = None,
    data_dir: DataDir = None,
) -> None:
    """Add a rule (any scope: the shell is the operator)."""
    raw: dict[str, Any] = {"effect": effect, "tool": tool, "mode": mode}
    for key, value in (("agent", agent), ("run_id", run_id), ("queue", queue),
                       ("reason", reason), ("expires_at", expires_at), ("id", rule_id)):  # fmt: skip
        if value is not None:
            raw[key] = value
    if args is not None:
        raw["args"] = json_arg(args, "--args")
    if route is not None:
        raw["route"] = json_arg(route, "--route")
    if priority is not None:
        raw["priority"] = priority
    with clear_errors():
        body = parse_body(raw)
        store = _store(data_dir)
        rule = store.create(body, created_by=by)
        typer.echo(f"{rule.id}: {rule.effect} {rule.tool} (active)")


@rules_app.command("revoke")
def revoke_rule(
    rule_id: Annotated[str, typer.Argument(metavar="ID", help="The rule id.")],
    data_dir: DataDir = None,
) -> None:
    """Revoke a rule: it never matches again and stays listed with revoked_at."""
    store = _store(data_dir)
    with clear_errors():
        rule = store.revoke(rule_id, by="shell")
    typer.echo(f"{rule.id}: revoked at {rule.revoked_at:%Y-%m-%d %H:%M:%S}Z")


@rules_app.command("replay")
def replay_rules(
    since: Annotated[str, typer.Option(help="From this ISO 8601 date or time (UTC by default).")],
    rule_id: Annotated[
        str | None,
        typer.Option("--rule", help="Replay this stored rule (default: every shadow rule)."),
    ] = None,
    file: Annotated[
        Path | None, typer.Option("--file", help="Replay the [[rules]] of this TOML file.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per rule.")] = False,
    data_dir: DataDir = None,
) -> None:
    """What rules would have decided since a date, against what people decided.

    Reads the audit trail: each request created since then, its outcome, and its call (from
    the request while Redis keeps it). Prints per rule the requests it would have decided,
    agreements and disagreements. Writes nothing.
    """
    if rule_id is not None and file is not None:
        fail("give --rule or --file, not both")
    start = parse_when(since, "--since")
    broker = connect(data_dir)
    store = broker.requests.rules
    with clear_errors():
        rules = _replayed(store, rule_id, file, broker.config)
        seen = requests_in(broker.audit.entries(start))
        kept = {r.id: r for r in broker.get_requests(list(seen))}
        agents = {}
        for run_id in {r.run_id for r in kept.values() if r.run_id}:
            agent = broker.run_store.run_field(run_id, "agent")
            if agent:
                agents[run_id] = agent
        reports = replay(rules, seen, kept, agents, broker.config)
    if not reports:
        typer.echo("no rules to replay (no shadow rules; give --rule or --file)")
    typer.echo(f"{len(seen)} approval requests created since {start:%Y-%m-%d %H:%M:%S}Z")
    for report in reports:
        if as_json:
            typer.echo(json.dumps({
                "rule": report.rule.id, "effect": report.rule.effect, "mode": report.rule.mode,
                "would_decide": report.would_decide, "agreements": report.agreements,
                "disagreements": [{"request_id": i, "outcome": o, "decided_by": a} for i, o, a in report.disagreements],
                "undecided": report.undecided, "unknown": report.unknown,
                **({"route": report.rule.route.public(), "came_from": report.came_from}
                   if report.rule.route is not None else {}),
            }))  # fmt: skip
            continue
        typer.echo(report.line())
        for rid, outcome, actor in report.disagreements[:20]:
            typer.echo(f"  disagrees: {rid} was {outcome} by {actor or 'nobody'}")


def _replayed(
    store: RuleStore, rule_id: str | None, file: Path | None, config: Config
) -> list[Rule]:
    """The rules to replay: one stored rule, a file's [[rules]], or every stored shadow rule."""
    if rule_id is not None:
        return [store.get(rule_id)]
    if file is not None:
        try:
            raw = tomllib.loads(file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            fail(f"cannot read {file}: {exc}")
        try:
            return parse_config_rules(raw.get("rules", []), config, source=str(file))
        except ConfigError as exc:
            fail(str(exc))
    return [r for r in store.list(active=True) if r.mode == "shadow"]
