"""`approval-broker rules list|add|revoke`: the operator's hand on policy rules.

The shell is the operator, so a rule added here may have any scope (as role `policy`).
Bad input prints one line and exits non-zero; nothing is written.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from approval_broker.cli_common import DataDir, clear_errors, connect, json_arg
from broker.auth import Principal
from broker.deciding import Deciding
from broker.models import Decision
from broker.rule_decisions import Remembered, RuleDecisions
from broker.rules import Rule, RuleStore, parse_body

rules_app = typer.Typer(
    help="Policy rules: always allow or deny matching tool calls.", no_args_is_help=True
)


def _store(data_dir: Path | None) -> RuleStore:
    return connect(data_dir).requests.rules


def remember_with(
    deciding: Deciding, request_id: str, decision: Decision, by: Principal, index: int
) -> Remembered:
    """`approval-broker decide ID approve --remember N`: decide and keep suggested rule N."""
    done = RuleDecisions(deciding).decide(request_id, decision, by, index, via=())
    if done.rule is not None:
        also = f"; it also decided {', '.join(done.siblings)}" if done.siblings else ""
        typer.echo(f"rule {done.rule.id} kept: {_line(done.rule)}{also}")
    return done


def _line(rule: Rule) -> str:
    scope = " ".join(f"{k}={v}" for k, v in rule.scope.items()) or "any scope"
    state = f"revoked {rule.revoked_at:%Y-%m-%d %H:%M:%S}Z" if rule.revoked_at else "active"
    args = f" args={json.dumps(rule.args, sort_keys=True)}" if rule.args else ""
    return f"{rule.id}  {rule.effect:<5} {rule.tool}  {scope}{args}  hits={rule.hits}  {state}"


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
    effect: Annotated[str, typer.Option(help="allow or deny.")],
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
    data_dir: DataDir = None,
) -> None:
    """Add a rule (any scope: the shell is the operator)."""
    raw: dict[str, Any] = {"effect": effect, "tool": tool}
    for key, value in (("agent", agent), ("run_id", run_id), ("queue", queue),
                       ("reason", reason), ("expires_at", expires_at), ("id", rule_id)):  # fmt: skip
        if value is not None:
            raw[key] = value
    if args is not None:
        raw["args"] = json_arg(args, "--args")
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
