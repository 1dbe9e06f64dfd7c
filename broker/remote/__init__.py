"""Python for agents and apps outside the fleet: a client of the HTTP API, and a pydantic-ai
capability that asks people through it.

    from broker.remote import AsyncRemoteBroker, BrokerApprovals, RemoteBroker
"""

from broker.remote.approvals import BrokerApprovals, request_ids
from broker.remote.client import AsyncRemoteBroker, RemoteBroker
from broker.remote.errors import RemoteError, Unauthorized

__all__ = [
    "AsyncRemoteBroker",
    "BrokerApprovals",
    "RemoteBroker",
    "RemoteError",
    "Unauthorized",
    "request_ids",
]
