"""Policy rules over HTTP (`/v1/rules`): list, create, read, revoke.

Role `policy` (or the admin token) may create rules of any scope; anyone else who decides
requests may create only rules scoped to a run or an agent, covering what they could decide.
Checking a body is broker.rules'; this module parses, authorises and answers.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Path, Query
from fastapi.responses import JSONResponse

from api.auth import Caller
from api.errors import ApiError
from api.schemas import ERRORS, check_json_safe
from api.state import State
from api.visibility import sees_all
from broker.domain.errors import Forbidden, InvalidInput, NotFound
from broker.domain.principals import Principal
from broker.domain.rules.matching import (
    POLICY,
    creator_channel_for,
    creator_roles_for,
    may_remember,
)
from broker.domain.rules.models import Rule, RuleBody, parse_body
from broker.facade import RuleExists, RuleStore
from broker.judge.deciding import INBOX

router = APIRouter(prefix="/v1/rules", tags=["rules"])

RuleId = Annotated[
    str, Path(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.-]+$", description="rule id")
]
Filter = Annotated[str | None, Query(min_length=1, max_length=200)]


def rule_store(state: State) -> RuleStore:
    """The broker's one RuleStore (the one creates match with), so its cache is shared."""
    return state.broker.requests.rules


Rules = Annotated[RuleStore, Depends(rule_store)]


@router.post(
    "",
    status_code=201,
    response_model=None,
    responses={
        201: {"model": Rule, "description": "the rule, active"},
        409: {"description": "a rule with this id exists"},
        **ERRORS,
    },
)
def create_rule(
    body: Annotated[dict[str, Any], Body(description="a rule body")],
    principal: Caller,
    rules: Rules,
) -> JSONResponse:
    """Create a rule. Any scope with role `policy`; otherwise scoped to a `run_id` or `agent`."""
    try:
        check_json_safe(body)
    except ValueError as exc:
        raise InvalidInput(str(exc).removeprefix("body."), code="invalid_rule") from None
    rule_body: RuleBody = parse_body(body)
    may_remember(principal, rule_body, None, rules.config.queue_roles(rule_body.queue or ""))
    try:
        rule = rules.create(
            rule_body,
            created_by=principal.name,
            creator_roles=creator_roles_for(principal),
            creator_channel=creator_channel_for(principal, INBOX),  # a bearer token's channel
        )
    except RuleExists as exc:
        raise ApiError(409, exc.code, exc.detail) from None
    return JSONResponse(rule.public(), status_code=201)


@router.get(
    "",
    response_model=None,
    responses={200: {"model": list[Rule], "description": "newest first"}, **ERRORS},
)
def list_rules(
    principal: Caller,
    rules: Rules,
    agent: Filter = None,
    run_id: Filter = None,
    tool: Annotated[
        str | None, Query(min_length=1, max_length=200, description="rules that apply to it")
    ] = None,
    active: Annotated[bool | None, Query(description="only active (or only inactive) ones")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> JSONResponse:
    """Rules, newest first, revoked ones included (with `revoked_at`) unless `active=true`."""
    found = rules.list(agent=agent, run_id=run_id, tool=tool, active=active, limit=limit)
    return JSONResponse([r.public() for r in found if sees_rule(principal, r)])


def sees_rule(principal: Principal, rule: Rule) -> bool:
    """Rules are read by role `policy`, an auditor and the admin; anyone else sees their own."""
    return principal.has_role(POLICY) or sees_all(principal) or rule.created_by == principal.name


@router.get(
    "/{rule_id}",
    response_model=None,
    responses={200: {"model": Rule, "description": "the rule"}, **ERRORS},
)
def get_rule(rule_id: RuleId, principal: Caller, rules: Rules) -> JSONResponse:
    """One rule, with its hits and `revoked_at` (404 to one who may not read it)."""
    rule = rules.get(rule_id)
    if not sees_rule(principal, rule):
        raise NotFound(f"no rule with id {rule_id!r}")
    return JSONResponse(rule.public())


@router.delete(
    "/{rule_id}",
    response_model=None,
    responses={200: {"model": Rule, "description": "the rule, revoked"}, **ERRORS},
)
def revoke_rule(rule_id: RuleId, principal: Caller, rules: Rules) -> JSONResponse:
    """Revoke a rule: it never matches again, and stays listed with `revoked_at`.

    Role `policy` revokes any rule; anyone else only the rules they made.
    """
    rule = rules.get(rule_id)
    if not principal.has_role(POLICY) and rule.created_by != principal.name:
        raise Forbidden(f"only role 'policy' or its creator may revoke rule {rule_id!r}")
    return JSONResponse(rules.revoke(rule_id, by=principal.name).public())
