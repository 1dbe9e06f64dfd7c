"""Who may see a request (SSE today; GET, list and the inbox may reuse it).

One rule, so every read path answers the same: a principal sees a request if it may decide
it, created it, has the role `auditor` (read-only, sees everything), or is the admin.
"""

from __future__ import annotations

from broker.auth import EVERY_ROLE, Principal
from broker.models import Request

AUDITOR = "auditor"


def may_see(principal: Principal, request: Request) -> bool:
    """True when `principal` may read `request` (and receive its events)."""
    if EVERY_ROLE in principal.roles or AUDITOR in principal.roles:
        return True
    if request.created_by is not None and request.created_by == principal.name:
        return True
    return principal.may_decide(request)
