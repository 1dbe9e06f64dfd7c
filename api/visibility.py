"""Who may see a request, on every read path: list, GET, waits, the inbox and SSE.

One rule, so every read path answers the same: a principal sees a request if it may decide
it (its roles, the request's `allowed_roles` and its queue's roles, as `broker.judge.deciding`
judges), created it, has the role `auditor` (read-only, sees everything), or is the admin.
Others are told the request does not exist (404), and lists never show it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from broker.domain.config import Config
from broker.domain.insights import Cell
from broker.domain.models import Request
from broker.domain.principals import EVERY_ROLE, REQUESTER, Principal

AUDITOR = "auditor"


def sees_all(principal: Principal) -> bool:
    return EVERY_ROLE in principal.roles or AUDITOR in principal.roles


def sees_own_only(principal: Principal) -> bool:
    """A requester-only token (an agent's) sees just what it created: its lists read the
    per-creator index."""
    return principal.roles == {REQUESTER}


def may_see(principal: Principal, request: Request, queue_roles: Collection[str] = ()) -> bool:
    """True when `principal` may read `request` (and receive its events); `queue_roles` are
    the minimum roles of the request's queue (`Config.queue_roles`)."""
    if sees_all(principal):
        return True
    if request.created_by is not None and request.created_by == principal.name:
        return True
    return principal.may_decide(request, queue_roles)


def sees_cell(principal: Principal, cell: Cell, config: Config) -> bool:
    """`may_see` for the requests of one insights cell (`broker.domain.insights`): those of
    one queue, with the same `allowed_roles`, by the same creator. A principal's stats are
    exactly those of the requests it may read."""
    if sees_all(principal):
        return True
    if cell.creator is not None and cell.creator == principal.name:
        return True
    return principal.may_decide_with(cell.allowed_roles, config.queue_roles(cell.queue))


def seer(principal: Principal, config: Config) -> Callable[[Request], bool]:
    """`may_see` for one principal, with each request's queue roles from `config`."""
    return lambda request: may_see(principal, request, config.queue_roles(request.queue))


def may_see_run(principal: Principal, started_by: str | None) -> bool:
    """A run is seen by the token that started it (`started_by`), an auditor and the admin."""
    return sees_all(principal) or (started_by is not None and started_by == principal.name)
