"""Python for agents and apps outside the fleet, kept under its old name.

The code lives in the `approval-broker-client` distribution (`clients/python/`, import
`approval_broker_client`), which installs without the server; this package re-exports it so
`from broker.remote import RemoteBroker` keeps working.
"""

from approval_broker_client import (
    AsyncRemoteBroker,
    BrokerApprovals,
    Decision,
    NewRequest,
    RemoteBroker,
    RemoteError,
    Request,
    Run,
    Unauthorized,
    request_ids,
)
from approval_broker_client.errors import error_for

__all__ = [
    "AsyncRemoteBroker",
    "BrokerApprovals",
    "Decision",
    "NewRequest",
    "RemoteBroker",
    "RemoteError",
    "Request",
    "Run",
    "Unauthorized",
    "error_for",
    "request_ids",
]
