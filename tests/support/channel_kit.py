"""What the channel contract (tests/channels/test_contract.py) asks of a channel kind: its kit.

Every registered kind has one, `tests/channels/<kind>/kit.py` defining `Kit` (a subclass of
`ChannelKit`): the config sections that point the kind at its fake platform or receiver, the
fake started and stopped, how to read what the kind posted (the copies as they stand, the
events it was sent), and how to make the replies the contract sends through the kind's
inbound route: a valid one, a forged one (a signature or token the platform would never
send), a stale one (too old, or a one-time marker already spent) and a stranger's (someone
the config names as no approver). The contract holds each kind to the same promises with them;
a kind with no kit fails it.

The contract's config (`contract_config`) has the same people and queues for every kind:
alice and bob decide (the kit says who they are on the platform), carol only asks; `default`
(quorum 1) and `two` (quorum 2) list the kit's channels, `next` is where an escalation goes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from fastapi.testclient import TestClient
from httpx import Response

from broker.domain.principals import hash_token
from broker.facade import Broker

ALICE, BOB, STRANGER = "alice", "bob", "stranger"
"""Who replies: two approvers, and someone the config names as no approver."""
VALID, FORGED, STALE = "valid", "forged", "stale"
"""How a reply is made."""
VOTE, ACK, DECISION, ESCALATION, TIMEOUT = "vote", "ack", "decision", "escalation", "timeout"
LATER_EVENTS = (VOTE, ACK, DECISION, ESCALATION, TIMEOUT)
"""What happens to a request after it is posted (the contract makes each happen)."""
TOKENS = {ALICE: "tok-contract-alice-0123456789", BOB: "tok-contract-bob-0123456789ab"}
REQUESTER_TOKEN = "tok-contract-carol-0123456789"
"""carol's: an agent's token, which asks and never decides (role `requester`)."""


@dataclass(frozen=True)
class Reply:
    """One call to a kind's inbound route, as the platform would make it. The contract sends
    it as is, and sends the very same call again to replay it."""

    path: str
    content: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)
    method: str = "POST"


class World(Protocol):
    """What a kit is handed: the contract's broker and the API app it drives in-process."""

    @property
    def broker(self) -> Broker: ...

    @property
    def client(self) -> TestClient: ...

    def send(self, reply: Reply) -> Response: ...


class ChannelKit(ABC):
    """One kind's kit. Class attributes say what the kind does with a request's later events;
    the methods give its config, its fake and its replies."""

    kind: ClassVar[str]
    channels: ClassVar[tuple[str, ...]]
    """The kind's channels the contract's queues list (`slack:approvals`)."""
    keeps_copies: ClassVar[bool] = False
    """True: each posted copy is edited to show every later event (`copies` reads them)."""
    hears: ClassVar[Mapping[str, str]] = {}
    """For a kind that is sent events instead: the event type it is sent for each later
    event (`heard` reads them); a later event not named here is sent nowhere."""
    no_stale: ClassVar[str | None] = None
    """Why the kind has no stale reply (no timestamp, no one-time marker), if it has none:
    the contract then leaves that case out for it."""

    @contextmanager
    def running(self) -> Iterator[None]:
        """The kind's fake platform or receiver, for the span of one test."""
        yield

    def started(self, world: World) -> None:
        """Called once the API and the notifier run (a kit that follows the API starts here)."""
        return None

    @abstractmethod
    def sections(self) -> dict[str, Any]:
        """The config's tables for the kind (`{"slack": {...}}`), pointing at the fake."""

    def identity(self, person: str) -> dict[str, Any]:
        """alice's or bob's approver field(s) on this kind (`{"slack_user_id": "U1"}`)."""
        return {}

    @abstractmethod
    def places(self) -> list[str]:
        """Where a new request is posted: one entry per place, each posted to once."""

    @abstractmethod
    def posts(self, request_id: str) -> list[str]:
        """The place of every post about the request so far (one entry per post)."""

    def copies(self, request_id: str) -> list[str]:
        """Each posted copy's text as it stands now (kinds that keep copies)."""
        return []

    def heard(self, request_id: str) -> list[str]:
        """The event types the kind was sent about the request, in order (kinds that hear)."""
        return []

    @abstractmethod
    def reply(self, world: World, request_id: str, person: str, how: str) -> Reply:
        """A reply approving the request, by `person`, made `how` (VALID, FORGED, STALE).

        A stale reply may need another one sent first (a one-time marker spent by a vote of
        alice's): the kit sends that itself (`world.send`), the request waiting in `two`."""

    @abstractmethod
    def accepted(self, response: Response) -> bool:
        """The route's answer to a reply that decided."""

    @abstractmethod
    def refused(self, response: Response, how: str, person: str) -> bool:
        """The route's answer to a reply it refused (forged, stale, a stranger's)."""


def contract_config(kit: ChannelKit) -> dict[str, Any]:
    """The one config of the contract, around the kit's channels and sections."""
    channels = list(kit.channels)
    people = {
        name: {"roles": ["ops"], "token_sha256": hash_token(TOKENS[name]), **kit.identity(name)}
        for name in (ALICE, BOB)
    }
    return {
        "queues": {
            "default": {"channels": channels, "timeout_s": 600},
            "two": {"channels": channels, "timeout_s": 600, "quorum": 2},
            "next": {"channels": ["inbox"], "timeout_s": 600},
        },
        "approvers": {
            **people,
            "carol": {"roles": ["requester"], "token_sha256": hash_token(REQUESTER_TOKEN)},
        },
        **kit.sections(),
    }
