"""Words every channel uses the same way: titles by kind, clipping, who may decide."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from broker.domain.config import Config
from broker.domain.models import Request
from broker.domain.printable import one_line

TITLES = {"approval": "Approval needed", "question": "Question", "external": "Result needed"}


def title(request: Request) -> str:
    return TITLES.get(request.kind, "Request")


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def risk(request: Request) -> str | None:
    """The risk label a routing rule gave the request, on one line ("high: refund over 500"),
    or None: every card shows it, near the top."""
    if not request.risk:
        return None
    return clip(one_line(request.risk), 200)


def deciders(
    config: Config,
    request: Request,
    *,
    role: Callable[[str], str] = str,
    person: Callable[[str], str | None] = lambda name: None,
) -> str:
    """Who may decide: "any approver", or the roles, with the people holding them that `person`
    can show (each channel formats roles and people its own way)."""
    if not request.allowed_roles:
        return "any approver"
    wanted = set(request.allowed_roles)
    line = "people with role " + " or ".join(role(r) for r in request.allowed_roles)
    people = [
        shown
        for name, approver in config.approvers.items()
        if wanted & set(approver.roles) and (shown := person(name))
    ]
    return f"{line} ({', '.join(people)})" if people else line


def rule_text(rule: dict[str, Any]) -> str:
    """`refund in this run, amount le 120`: a suggested rule as one line."""
    scope = (
        "in this run"
        if rule.get("run_id")
        else f"for agent {rule['agent']}"
        if rule.get("agent")
        else "everywhere"
    )
    args = ", ".join(
        f"{path} {' '.join(f'{op} {v}' for op, v in m.items()) if isinstance(m, dict) else f'= {m}'}"
        for path, m in (rule.get("args") or {}).items()
    )
    return f"{rule.get('tool')} {scope}" + (f", {args}" if args else "")
