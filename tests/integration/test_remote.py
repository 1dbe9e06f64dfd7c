"""Agents outside the fleet: a pydantic-ai agent in this plain process, with `BrokerApprovals`,
pauses on a tool call, is decided over REST by someone else, and completes, live (within
`live_wait_s`) or stopped and resumed with `results_for`. Also the typed client's errors."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from approval_broker_client import (
    AsyncRemoteBroker,
    BrokerApprovals,
    RemoteBroker,
    Request,
    Unauthorized,
)
from approval_broker_client.results import RoundNotReady
from fastapi import FastAPI
from pydantic_ai import DeferredToolRequests

from api.app import create_app
from api.testing import ServerThread
from broker.domain.config import Config
from broker.domain.errors import Conflict, Forbidden, InvalidInput, NotFound
from broker.domain.settings import Settings
from broker.facade import Broker
from tests.support.auth import person
from tests.support.remote_agents import decide_when_asked, make_agent  # noqa: F401

AGENT_TOKEN, BOB_TOKEN = "tok-agent", "tok-bob"


API_CONFIG = {
    "queues": {
        # bob escalates default -> finance: a person may only follow escalate_to
        "default": {"timeout_s": 600, "escalate_to": "finance"},
        "finance": {"timeout_s": 600},
    },
    "approvers": {
        "agent": person(AGENT_TOKEN, ["requester"]),
        "bob": person(BOB_TOKEN, ["finance"]),
    },
}


@pytest.fixture
def app(cfg: Config, api_broker: Broker) -> FastAPI:
    return create_app(Settings(), cfg, api_broker)


@pytest.fixture
def server(app: FastAPI) -> Iterator[ServerThread]:
    with ServerThread(app) as s:
        yield s


@pytest.fixture
def agent_client(server: ServerThread) -> Iterator[RemoteBroker]:
    with RemoteBroker(server.url, AGENT_TOKEN) as client:
        yield client


@pytest.fixture
def bob(server: ServerThread) -> Iterator[RemoteBroker]:
    with RemoteBroker(server.url, BOB_TOKEN) as client:
        yield client


# ---- a scripted agent: refund (needs approval) and ask_customer (a question) -------------


def test_live_an_approval_decided_within_live_wait_continues_the_same_run(
    agent_client: RemoteBroker, bob: RemoteBroker, api_broker: Broker
) -> None:
    executed: list[Any] = []
    agent = make_agent(
        BrokerApprovals(agent_client, queue="finance", live_wait_s=30, agent="refunds"), executed
    )
    person = decide_when_asked(bob, lambda r: bob.approve(r.id))
    result = agent.run_sync("Refund $120 on A103")
    person.join(10)
    assert result.output == "refund: refunded 120.0 on A103"
    assert executed == [("A103", 120.0)]
    [request] = api_broker.list_requests()
    assert request.status == "approved" and request.queue == "finance"
    assert request.decision and request.decision.decided_by == "bob"
    assert request.metadata["approval_broker"] == {"agent": "refunds", "run_id": result.run_id}


def test_live_a_question_answered_and_a_modified_approval(
    agent_client: RemoteBroker, bob: RemoteBroker
) -> None:
    executed: list[Any] = []
    agent = make_agent(BrokerApprovals(agent_client, live_wait_s=30), executed)

    def decide(r: Request) -> None:
        if r.kind == "question":
            assert r.prompt == "Ask the customer: Photos?"
            bob.answer(r.id, "yes, torn floor")
        else:
            bob.modify(r.id, {"order_id": "A103", "amount": 80})

    person = decide_when_asked(bob, decide, n=2)
    result = agent.run_sync("Refund $120 on A103 and ask for photos")
    person.join(10)
    assert executed == [("A103", 80)]
    assert "refund: refunded 80" in result.output
    assert "ask_customer: yes, torn floor" in result.output


def test_stopped_then_resumed_with_results_for(
    agent_client: RemoteBroker, bob: RemoteBroker, api_broker: Broker
) -> None:
    executed: list[Any] = []
    agent = make_agent(BrokerApprovals(agent_client, live_wait_s=0.2), executed)
    first = agent.run_sync("Refund $120 on A103")
    stopped = first.output
    assert isinstance(stopped, DeferredToolRequests)
    assert [c.tool_name for c in stopped.approvals] == ["refund"]
    [request] = api_broker.list_requests(status="pending")
    assert stopped.metadata["call-refund"]["approval_broker_request_id"] == request.id
    with pytest.raises(RoundNotReady):
        agent_client.results_for(stopped)  # nobody has decided yet

    bob.reject(request.id, "Photos show wear, not damage")
    results = agent_client.results_for(stopped)
    assert results.answered_by == {"call-refund": "bob"}
    resumed = agent.run_sync(message_history=first.all_messages(), deferred_tool_results=results)
    assert resumed.output == "refund: Photos show wear, not damage"
    assert executed == []  # a rejected refund never ran


def test_results_for_waits_for_the_outcomes(agent_client: RemoteBroker, bob: RemoteBroker) -> None:
    agent = make_agent(BrokerApprovals(agent_client), [])
    first = agent.run_sync("Refund $120 on A103")
    person = decide_when_asked(bob, lambda r: bob.approve(r.id))
    results = agent_client.results_for(first.output, wait_s=30)
    person.join(10)
    resumed = agent.run_sync(message_history=first.all_messages(), deferred_tool_results=results)
    assert resumed.output == "refund: refunded 120.0 on A103"


def test_the_same_run_asking_again_makes_no_second_request(
    agent_client: RemoteBroker, api_broker: Broker
) -> None:
    agent = make_agent(BrokerApprovals(agent_client), [])
    one = agent.run_sync("Refund $120 on A103", run_id="run-fixed")
    two = agent.run_sync("Refund $120 on A103", run_id="run-fixed")  # e.g. a retried process
    assert len(api_broker.list_requests()) == 1
    assert one.output.metadata == two.output.metadata
    agent.run_sync("Refund $120 on A103", run_id="run-other")  # another run asks anew
    assert len(api_broker.list_requests()) == 2


def test_an_async_client_works_as_well(
    agent_client: RemoteBroker, bob: RemoteBroker, server: ServerThread
) -> None:
    executed: list[Any] = []

    async def main() -> Any:
        async with AsyncRemoteBroker(server.url, AGENT_TOKEN) as client:
            agent = make_agent(BrokerApprovals(client, live_wait_s=30), executed)
            return await agent.run("Refund $120 on A103")

    import asyncio

    person = decide_when_asked(bob, lambda r: bob.approve(r.id))
    result = asyncio.run(main())
    person.join(10)
    assert result.output == "refund: refunded 120.0 on A103"
    assert executed == [("A103", 120.0)]


def test_errors_are_the_brokers_own(
    agent_client: RemoteBroker, bob: RemoteBroker, server: ServerThread
) -> None:
    request = agent_client.create_request(tool_name="refund", args={"amount": 1})
    with pytest.raises(NotFound):
        bob.get_request("req_nope")
    with pytest.raises(Forbidden):
        agent_client.approve(request.id)  # a requester never decides
    with pytest.raises(InvalidInput) as bad:
        agent_client.create_request(tool_name="refund", queue="nowhere")
    assert bad.value.code == "unknown_queue"
    bob.approve(request.id)
    with pytest.raises(Conflict) as lost:
        bob.reject(request.id, "too late")
    assert isinstance(lost.value.request, Request) and lost.value.request.status == "approved"
    with pytest.raises(Unauthorized), RemoteBroker(server.url, "wrong") as stranger:
        stranger.list_requests()
    with pytest.raises(NotFound) as unknown:
        agent_client.start_run("nobody", "hi")
    assert unknown.value.code == "unknown_agent"
    with pytest.raises(NotFound):
        agent_client.send_prompt("run_nope", "never mind")
    other = agent_client.create_request(tool_name="refund", args={"amount": 2})
    assert bob.escalate(other.id, "finance", reason="over my limit").queue == "finance"
