"""One contract for every registered channel kind (`broker.domain.channel_kinds.names()`) and the
test-only FakeChat kind (tests/support/fakechat/), each through its kit
(`tests/channels/<kind>/kit.py`, see tests/support/channel_kit.py):

- a new request is posted once to each place the kind posts to;
- each later event (a vote in a quorum of 2, an ack, the decision, an escalation away, a
  time-out) reaches what the kind posted: kinds that keep copies edit every copy to show it,
  never posting again; kinds that are sent events are sent it (or not, as the kit says); mail
  asks for decisions only, so nothing more is mailed;
- a forged reply, a stale one (too old, or its one-time marker spent) and a stranger's (someone
  the config names as no approver) are refused, each changing nothing: the request still
  pending, no vote, no history entry;
- a valid reply decides, once: the same reply again records nothing new.

Real parts throughout: the fakes of tests/support/fakes (they check what each platform checks),
a real Redis, the API app in-process and a notifier in threads. A kind registered without a kit
fails here, so an eighth kind gets the contract once it writes its kit.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import pytest
from fastapi.testclient import TestClient
from httpx import Response
from redis import Redis

from api.app import create_app
from broker.domain import channel_kinds
from broker.domain.config import parse_config
from broker.domain.models import Decision, NewRequest, Outcome, Status
from broker.domain.settings import Settings
from broker.facade import Broker
from tests.support import fakechat
from tests.support.channel_kit import (
    ACK,
    ALICE,
    BOB,
    DECISION,
    ESCALATION,
    FORGED,
    LATER_EVENTS,
    STALE,
    STRANGER,
    TIMEOUT,
    VALID,
    VOTE,
    ChannelKit,
    Reply,
    contract_config,
)
from tests.support.fakes.harness import running
from tests.support.notifier_setup import quiet
from tests.support.waiting import wait_for

KINDS = [*channel_kinds.names(), fakechat.KIND]
"""Every kind the entry points register, and the test-only one (registered below)."""

SHOWN = {
    VOTE: "1 of 2 approvals",
    ACK: "is on it",
    DECISION: "Approved",
    ESCALATION: "Escalated to",
    TIMEOUT: "Timed out",
}
"""What every copy a kind keeps says once the event happened (each kind's own words)."""


def kit_module(kind: str) -> ModuleType | None:
    """`tests.channels.<kind>.kit`, or None when the kind has none."""
    name = f"tests.channels.{kind}.kit"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name in (name, f"tests.channels.{kind}"):
            return None
        raise


def with_stale() -> list[str]:
    """The kinds that have a stale reply (and those without a kit, which fail)."""
    return [k for k in KINDS if (m := kit_module(k)) is None or m.Kit.no_stale is None]


@pytest.fixture(scope="module", autouse=True)
def fakechat_kind() -> Iterator[None]:
    """FakeChat is a kind for this module's span (a real kind is an entry point)."""
    with channel_kinds.registered(fakechat.plugin):
        yield


@dataclass
class World:
    """One kind on the contract's config: its fake, the broker, the API and a notifier."""

    kit: ChannelKit
    broker: Broker
    client: TestClient

    def send(self, reply: Reply) -> Response:
        return self.client.request(
            reply.method, reply.path, content=reply.content, headers=dict(reply.headers)
        )

    def create(self, queue: str = "default") -> str:
        new = NewRequest(tool_name="refund", args={"order_id": "A1", "amount": 120}, queue=queue)
        return self.broker.create_request(new).id

    def posted(self, queue: str = "default") -> str:
        """A new request in `queue`, once the kind has posted it and the notifier is idle."""
        request_id = self.create(queue)
        wait_for(lambda: self.kit.posts(request_id))
        self.quiet()
        return request_id

    def quiet(self) -> None:
        wait_for(lambda: quiet(self.broker))


@pytest.fixture
def world(kind: str, redis: Redis) -> Iterator[World]:
    module = kit_module(kind)
    if module is None:
        pytest.fail(
            f"channel kind {kind!r} is registered but has no kit: write "
            f"tests/channels/{kind}/kit.py (docs/adding-a-channel.md says how)"
        )
    kit: ChannelKit = module.Kit()
    assert kit.kind == kind
    with kit.running():
        config = parse_config(contract_config(kit))
        broker = Broker(redis, config, prefix="t:")
        with running(broker), TestClient(create_app(Settings(), config, broker)) as client:
            world = World(kit, broker, client)
            kit.started(world)
            yield world
    assert broker.dead_letters() == []


def state(broker: Broker, request_id: str) -> tuple[Any, ...]:
    """What a refused reply must leave as it was."""
    request = broker.get_request(request_id)
    return request.status, request.approvals, request.history, request.decision


def happen(broker: Broker, request_id: str, event: str) -> None:
    """Make `event` happen to the request, as any channel or the sweeper would."""
    approve = Decision(outcome=Outcome.approved)
    if event == VOTE:
        broker.decide(request_id, approve, decided_by=ALICE)
    elif event == ACK:
        broker.acks.ack(request_id, acked_by=ALICE, in_queue="default")
    elif event == DECISION:
        broker.decide(request_id, approve, decided_by=BOB)
    elif event == ESCALATION:
        broker.escalate(request_id, "next", decided_by=ALICE)
    else:
        assert [r.request_id for r in broker.sweep(now=time.time() + 7200)] == [request_id]


# ---- the contract ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_every_registered_kind_has_a_kit(kind: str) -> None:
    module = kit_module(kind)
    assert module is not None, f"write tests/channels/{kind}/kit.py"
    assert issubclass(module.Kit, ChannelKit) and module.Kit.kind == kind


@pytest.mark.parametrize("kind", KINDS)
def test_a_new_request_is_posted_once_to_each_place(world: World) -> None:
    request_id = world.posted()
    assert sorted(world.kit.posts(request_id)) == sorted(world.kit.places())
    assert world.broker.get_request(request_id).is_pending


@pytest.mark.parametrize("event", LATER_EVENTS)
@pytest.mark.parametrize("kind", KINDS)
def test_each_later_event_reaches_what_the_kind_posted(world: World, event: str) -> None:
    kit = world.kit
    request_id = world.posted("two" if event == VOTE else "default")
    posts, copies, heard = kit.posts(request_id), kit.copies(request_id), kit.heard(request_id)
    assert copies if kit.keeps_copies else not copies

    happen(world.broker, request_id, event)

    if kit.keeps_copies:
        shown = SHOWN[event]
        wait_for(
            lambda: (
                (now := kit.copies(request_id)) != copies
                and len(now) == len(copies)
                and all(shown in copy for copy in now)
            )
        )
    elif event in kit.hears:
        wait_for(lambda: kit.hears[event] in kit.heard(request_id)[len(heard) :])
    world.quiet()
    assert kit.posts(request_id) == posts  # edited, told or left alone: never posted again
    if not kit.keeps_copies and event not in kit.hears:
        assert kit.heard(request_id) == heard


@pytest.mark.parametrize("kind", KINDS)
def test_a_forged_reply_is_refused_and_changes_nothing(world: World) -> None:
    request_id = world.posted()
    before = state(world.broker, request_id)

    answer = world.send(world.kit.reply(world, request_id, BOB, FORGED))

    assert world.kit.refused(answer, FORGED, BOB), (answer.status_code, answer.text)
    world.quiet()
    assert state(world.broker, request_id) == before
    assert world.broker.get_request(request_id).status is Status.pending


@pytest.mark.parametrize("kind", with_stale())
def test_a_stale_reply_is_refused_and_changes_nothing(world: World) -> None:
    request_id = world.posted("two")
    reply = world.kit.reply(world, request_id, BOB, STALE)  # may spend a marker with a vote
    world.quiet()  # the notifier's notes of that vote are in the history
    before = state(world.broker, request_id)

    answer = world.send(reply)

    assert world.kit.refused(answer, STALE, BOB), (answer.status_code, answer.text)
    world.quiet()
    assert state(world.broker, request_id) == before
    assert world.broker.get_request(request_id).status is Status.pending


@pytest.mark.parametrize("kind", KINDS)
def test_a_strangers_reply_is_refused_and_changes_nothing(world: World) -> None:
    request_id = world.posted()
    before = state(world.broker, request_id)

    answer = world.send(world.kit.reply(world, request_id, STRANGER, VALID))

    assert world.kit.refused(answer, VALID, STRANGER), (answer.status_code, answer.text)
    world.quiet()
    assert state(world.broker, request_id) == before
    assert world.broker.get_request(request_id).status is Status.pending


@pytest.mark.parametrize("kind", KINDS)
def test_a_valid_reply_decides_once(world: World) -> None:
    request_id = world.posted()
    reply = world.kit.reply(world, request_id, ALICE, VALID)

    answer = world.send(reply)

    assert world.kit.accepted(answer), (answer.status_code, answer.text)
    world.quiet()  # the notifier's notes of the decision are in the history
    decided = world.broker.get_request(request_id)
    assert decided.status is Status.approved
    assert decided.decision is not None and ALICE in decided.decision.decided_by
    again = world.send(reply)
    assert again.status_code < 500, again.text
    world.quiet()
    assert world.broker.get_request(request_id) == decided
