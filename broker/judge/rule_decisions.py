"""A decision that remembers: what rule it keeps, and whether its decider may keep it.

Every channel that offers "always" (REST and the inbox, Slack's modal, Telegram's and Discord's
rule buttons, the email link, webhook replies, the CLI) reaches this through
`broker.judge.Judge.decide(..., remember=...)`, after the same who-may-decide checks as any
decision (`broker.judge.deciding`). The rule, the decision and the run's pending siblings the
rule covers are written in one step (`broker.store.remembering`), so the round resumes exactly
once. Pure functions: the judge reads what they need and runs the step.

A remembered rule never grants more than its creator could decide (`may_remember`), and a
request that needs more than one vote can't be remembered except by role `policy`.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace
from datetime import datetime
from typing import Any

from broker.domain.config import Config
from broker.domain.errors import InvalidInput
from broker.domain.models import Decision, Request, utcnow
from broker.domain.principals import Principal
from broker.domain.rule_decided import OUTCOME_EFFECT
from broker.domain.rules.matching import (
    POLICY,
    Call,
    creator_channel_for,
    creator_roles_for,
    in_queue,
    matches,
    may_remember,
)
from broker.domain.rules.models import Rule, RuleBody, parse_body
from broker.judge.deciding import channel_of, check_applies
from broker.store.rule_records import new_rule_id
from broker.store.rule_store import may_bypass

Remember = int | dict[str, Any]
"""An index into the request's `suggested_rules`, or a rule body."""


def check_remembers(decision: Decision) -> None:
    """Only an approval or a rejection keeps a rule (checked before anything is read)."""
    if decision.outcome not in OUTCOME_EFFECT:
        raise InvalidInput(
            "remember goes only with an 'approved' or 'rejected' decision", code="invalid_rule"
        )


def rule_body(remember: Remember, request: Request, decision: Decision) -> RuleBody:
    """The rule `remember` names, its effect following the outcome (approved: allow)."""
    effect = OUTCOME_EFFECT[decision.outcome]
    if isinstance(remember, bool) or not isinstance(remember, int | dict):
        raise InvalidInput(
            "remember: give the index of a suggested rule or a rule body", code="invalid_rule"
        )
    mode: dict[str, Any] = {}
    if (
        isinstance(remember, dict)
        and set(remember) <= {"suggested", "mode"}
        and "suggested" in remember
    ):
        # "try this rule": a suggested rule, kept in shadow (`{"suggested": 0, "mode": "shadow"}`)
        mode = {"mode": remember["mode"]} if "mode" in remember else {}
        remember = remember["suggested"]
        if isinstance(remember, bool) or not isinstance(remember, int):
            raise InvalidInput(
                "remember.suggested: give the index of a suggested rule", code="invalid_rule"
            )
    if isinstance(remember, int):
        if not 0 <= remember < len(request.suggested_rules):
            raise InvalidInput(
                f"remember: request {request.id} has {len(request.suggested_rules)} suggested"
                f" rules; {remember} is none of them",
                code="invalid_rule",
            )
        raw: dict[str, Any] = {**request.suggested_rules[remember], "effect": effect, **mode}
    else:
        raw = {"effect": effect, **remember}
    body = parse_body(raw, "remember")
    if body.effect != effect:
        raise InvalidInput(
            f"remember.effect: an {decision.outcome.value!r} decision remembers an {effect!r} rule",
            code="invalid_rule",
        )
    if body.effect == "deny" and body.reason is None and decision.reason:
        body = body.model_copy(update={"reason": decision.reason})
    return body


def run_rule_index(request: Request) -> int | None:
    """Which of the request's suggested rules is "this tool, this run" (the email link's)."""
    for i, rule in enumerate(request.suggested_rules):
        if rule.get("run_id") and not rule.get("args"):
            return i
    return None


def rule_to_keep(
    request: Request,
    decision: Decision,
    decider: Principal,
    config: Config,
    *,
    remember: Remember,
) -> tuple[Decision, RuleBody]:
    """The decision (checked as any, `check_applies`) and the rule body `decider` asks to keep
    with it on a pending `request`: InvalidInput `invalid_rule` (another kind than approval, a
    bad body, a request of quorum > 1 without role `policy` and `quorum_bypass`) or Forbidden
    (wider than `decider` may decide)."""
    if request.kind != "approval":
        raise InvalidInput(
            f"rules decide only approval requests; {request.id} is a {request.kind}",
            code="invalid_rule",
        )
    decision = check_applies(request, decision, config)
    body = rule_body(remember, request, decision)
    if int(getattr(request, "quorum", 1) or 1) > 1 and not (
        decider.has_role(POLICY) and body.quorum_bypass
    ):
        raise InvalidInput(
            f"request {request.id} needs more than one vote; only role 'policy' may"
            " remember a rule from it, and only one with quorum_bypass",
            code="invalid_rule",
        )
    may_remember(decider, body, request, config.queue_roles(body.queue or ""))
    return decision, body


def new_rule(
    body: RuleBody,
    request: Request,
    decider: Principal,
    via: Collection[str],
    config: Config,
    *,
    decided_by: str,
    now: datetime,
) -> Rule:
    """The rule kept from `body`, made by `decided_by` from `request` (not already expired)."""
    if body.expires_at is not None and body.expires_at <= now:
        raise InvalidInput("remember.expires_at: is already past", code="invalid_rule")
    return Rule.model_validate(
        {
            **body.model_dump(),
            "id": body.id or new_rule_id(),
            "created_by": decided_by,
            "created_at": utcnow(),
            "from_request": request.id,
            "creator_roles": creator_roles_for(decider),
            "creator_channel": creator_channel_for(decider, channel_of(request, via, config)),
        }
    )


def covered(
    rule: Rule, agent: str | None, others: list[Request], config: Config, now: datetime
) -> list[Request]:
    """Which of `others` (the other pending requests of a run, its agent `agent`) the new
    rule decides with the request it is kept from."""
    found = []
    for sibling in others:
        call = in_queue(replace(Call.of(sibling, agent=agent), run_id=sibling.run_id), config)
        quorum = int(getattr(sibling, "quorum", 1) or 1)
        if sibling.is_pending and may_bypass(rule, quorum) and matches(rule, call, now):
            found.append(sibling)
    return found
