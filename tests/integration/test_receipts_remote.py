"""`BrokerApprovals` outside the fleet runs an approved tool only on a receipt that holds.

A pydantic-ai agent in this process, the API on a real HTTP server: each round asks for a refund
(an approval) and a question, so the agent's live wait returns only once both are decided, and
the test changes what it needs to in between. The receipt is verified with the JWKS and spent
at the broker just before the tool runs; a refused one leaves the tool unrun.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from approval_broker_client import BrokerApprovals, RemoteBroker, Request
from fastapi import FastAPI
from pydantic_ai import DeferredToolRequests

from api.app import create_app
from api.testing import ServerThread
from broker.domain.config import Config, parse_config
from broker.domain.receipts import REFUSED_TEXT
from broker.domain.settings import Settings
from broker.facade import Broker
from tests.support.auth import person
from tests.support.receipts import key_file
from tests.support.remote_agents import decide_when_asked, make_agent

TOKENS = {"agent": "tok-agent", "bob": "tok-bob", "carol": "tok-carol"}
PROMPT = "Refund $120 on A103 and ask for photos"


@pytest.fixture(name="cfg")
def cfg_with_a_receipt_key_file(tmp_path: Path) -> Config:
    return parse_config(
        {
            "approvers": {
                "agent": person(TOKENS["agent"], ["requester"]),
                "bob": person(TOKENS["bob"], ["finance"]),
                "carol": person(TOKENS["carol"], ["finance"]),
            },
            "receipts": {"key_file": str(key_file(tmp_path)), "recheck_roles": True},
        }
    )


@pytest.fixture
def server(cfg: Config, api_broker: Broker) -> Iterator[ServerThread]:
    app: FastAPI = create_app(Settings(), cfg, api_broker)
    with ServerThread(app) as s:
        yield s


def _client(server: ServerThread, name: str) -> RemoteBroker:
    return RemoteBroker(server.url, TOKENS[name])


def _run(server: ServerThread, decide: Any) -> tuple[str, list[Any]]:
    executed: list[Any] = []
    with _client(server, "agent") as agent_client, _client(server, "carol") as carol:
        agent = make_agent(BrokerApprovals(agent_client, live_wait_s=30), executed)
        person = decide_when_asked(carol, decide, n=2)
        result = agent.run_sync(PROMPT)
        person.join(10)
    return str(result.output), executed


def test_an_approved_call_runs_on_its_receipt_spent_at_the_broker(
    server: ServerThread, api_broker: Broker
) -> None:
    with _client(server, "bob") as bob:

        def decide(r: Request) -> None:
            if r.kind == "question":
                bob.answer(r.id, "yes")
            else:
                bob.approve(r.id)

        output, executed = _run(server, decide)
    assert executed == [("A103", 120)]
    assert "refund: refunded" in output
    assert api_broker.counts().get("receipt_spent") == 1


def test_a_receipt_tampered_before_the_tool_runs_is_refused(
    server: ServerThread, api_broker: Broker
) -> None:
    with _client(server, "bob") as bob:

        def decide(r: Request) -> None:
            if r.kind == "question":
                return
            bob.approve(r.id)
            key = api_broker.keys.request(r.id)
            stored = json.loads(api_broker.redis.hget(key, "decision"))
            head, body, sig = stored["receipt"].split(".")
            stored["receipt"] = f"{head}.{body}.{'B' if sig[0] != 'B' else 'C'}{sig[1:]}"
            api_broker.redis.hset(key, "decision", json.dumps(stored))
            question = next(q for q in bob.list_requests(status="pending") if q.kind == "question")
            bob.answer(question.id, "yes")  # now the agent's wait returns

        output, executed = _run(server, decide)
    assert executed == []
    assert REFUSED_TEXT in output and "bad_signature" in output


def test_an_approver_removed_before_the_tool_runs_is_refused_at_the_broker(
    server: ServerThread, api_broker: Broker, cfg: Config
) -> None:
    with _client(server, "bob") as bob:

        def decide(r: Request) -> None:
            if r.kind == "question":
                return
            bob.approve(r.id)
            del cfg.approvers["bob"]  # the running API's config: bob is no longer an approver
            with _client(server, "carol") as carol:
                question = next(
                    q for q in carol.list_requests(status="pending") if q.kind == "question"
                )
                carol.answer(question.id, "yes")

        output, executed = _run(server, decide)
    assert executed == []
    assert REFUSED_TEXT in output and "approver_revoked" in output
    assert api_broker.counts().get("receipt_refused:approver_revoked") == 1


def _stopped_then_resumed(
    server: ServerThread, api_broker: Broker, tamper: bool
) -> tuple[str, list[Any]]:
    """A run that stops with its calls pending (no live wait), is decided, and is resumed later
    from `results_for` by a new agent object, as another process would."""
    executed: list[Any] = []
    with _client(server, "agent") as agent_client, _client(server, "bob") as bob:
        first = make_agent(BrokerApprovals(agent_client, live_wait_s=0), executed)
        stopped = first.run_sync(PROMPT)
        assert isinstance(stopped.output, DeferredToolRequests)
        for request in bob.list_requests(status="pending"):
            if request.kind == "question":
                bob.answer(request.id, "yes")
            else:
                bob.approve(request.id)
                if tamper:
                    key = api_broker.keys.request(request.id)
                    stored = json.loads(api_broker.redis.hget(key, "decision"))
                    head, body, sig = stored["receipt"].split(".")
                    stored["receipt"] = f"{head}.{body}.{'B' if sig[0] != 'B' else 'C'}{sig[1:]}"
                    api_broker.redis.hset(key, "decision", json.dumps(stored))
        later = make_agent(BrokerApprovals(agent_client, live_wait_s=0), executed)
        resumed = later.run_sync(
            message_history=stopped.all_messages(),
            deferred_tool_results=agent_client.results_for(stopped.output),
        )
    return str(resumed.output), executed


def test_a_run_resumed_later_runs_its_approved_call_on_a_receipt_spent_at_the_broker(
    server: ServerThread, api_broker: Broker
) -> None:
    output, executed = _stopped_then_resumed(server, api_broker, tamper=False)
    assert executed == [("A103", 120)]
    assert api_broker.counts().get("receipt_spent") == 1


def test_a_run_resumed_later_refuses_a_receipt_tampered_meanwhile(
    server: ServerThread, api_broker: Broker
) -> None:
    output, executed = _stopped_then_resumed(server, api_broker, tamper=True)
    assert executed == []
    assert REFUSED_TEXT in output and "bad_signature" in output
