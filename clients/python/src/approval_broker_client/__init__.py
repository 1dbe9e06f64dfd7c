"""The Python client of approval-broker's HTTP API, for apps and agents outside the fleet.

    from approval_broker_client import AsyncRemoteBroker, BrokerApprovals, RemoteBroker

`RemoteBroker` / `AsyncRemoteBroker` need only httpx and pydantic; `BrokerApprovals`,
`request_ids`, `results_for` and `RoundNotReady` need the `pydantic-ai` extra and are imported
on first use, so an app without pydantic-ai can still import this package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from approval_broker_client.client import AsyncRemoteBroker, RemoteBroker
from approval_broker_client.errors import (
    BrokerError,
    Conflict,
    Forbidden,
    InvalidInput,
    NotFound,
    RemoteError,
    Unauthorized,
)
from approval_broker_client.models import (
    Decision,
    HistoryEntry,
    NewRequest,
    Outcome,
    Request,
    Run,
    RunStatus,
    Stats,
    Status,
    Vote,
)

if TYPE_CHECKING:
    from approval_broker_client.approvals import BrokerApprovals
    from approval_broker_client.deferred import request_ids
    from approval_broker_client.results import RoundNotReady, results_for

_WITH_PYDANTIC_AI = {
    "BrokerApprovals": "approval_broker_client.approvals",
    "request_ids": "approval_broker_client.deferred",
    "RoundNotReady": "approval_broker_client.results",
    "results_for": "approval_broker_client.results",
}


def __getattr__(name: str) -> Any:
    """The names that need pydantic-ai, imported when first used."""
    module = _WITH_PYDANTIC_AI.get(name)
    if module is None:
        raise AttributeError(f"module 'approval_broker_client' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [
    "AsyncRemoteBroker",
    "BrokerApprovals",
    "BrokerError",
    "Conflict",
    "Decision",
    "Forbidden",
    "HistoryEntry",
    "InvalidInput",
    "NewRequest",
    "NotFound",
    "Outcome",
    "RemoteBroker",
    "RemoteError",
    "Request",
    "RoundNotReady",
    "Run",
    "RunStatus",
    "Stats",
    "Status",
    "Unauthorized",
    "Vote",
    "request_ids",
    "results_for",
]
