"""A compatibility import path: the names of `broker.domain.models`, written by users
(`RunStatus`, `Request`...).
"""

# compatibility import path: re-exports only
from broker.domain.models import (  # noqa: F401
    KINDS,
    MAX_QUORUM,
    Decision,
    HistoryEntry,
    NewRequest,
    Outcome,
    Request,
    Run,
    RunStatus,
    Status,
    Vote,
    from_timestamp,
    utcnow,
)

__all__ = [
    "KINDS",
    "MAX_QUORUM",
    "Decision",
    "HistoryEntry",
    "NewRequest",
    "Outcome",
    "Request",
    "Run",
    "RunStatus",
    "Status",
    "Vote",
    "from_timestamp",
    "utcnow",
]
