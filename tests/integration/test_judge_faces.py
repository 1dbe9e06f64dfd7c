"""The judge's two faces share one core: `Judge.adecide` (redis.asyncio, the API's event loop)
answers as `Judge.decide` does, case by case on twin requests, and the REST decide route runs
it with no thread: the sync face is not called for a plain decision, only for one that keeps
a rule."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient
from redis import Redis

from broker.domain.config import Config, parse_config
from broker.domain.errors import BrokerError
from broker.domain.models import Decision, NewRequest, Outcome
from broker.domain.principals import Principal, operator
from broker.facade import Broker
from broker.judge import Judge
from broker.redis.connection import connect_async
from tests.support.auth import bearer, person

TOKEN = "tok-alice-judge-faces"
API_CONFIG = {
    "queues": {
        "default": {"channels": ["inbox"], "escalate_to": "managers"},
        "managers": {"channels": ["inbox"]},
        "pair": {"channels": ["inbox"], "quorum": 2},
    },
    "agents": {"refunds": {"path": "refunds_demo:agent"}},
    "approvers": {
        "alice": person(TOKEN, ["ops"]),
        "bob": person("tok-bob-judge-faces", ["ops"]),
    },
}
ALICE = Principal("alice", frozenset({"ops"}))
BOB = Principal("bob", frozenset({"ops"}))


def test_a_rest_decision_runs_the_judge_on_the_event_loop(
    client: TestClient, api_broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[str] = []
    sync_face = Judge.decide

    def watched(self: Judge, *args: Any, **kwargs: Any) -> Any:
        ran.append("sync")
        return sync_face(self, *args, **kwargs)

    monkeypatch.setattr(Judge, "decide", watched)
    req = api_broker.create_request(NewRequest(tool_name="refund", args={"amount": 5}))
    resp = client.post(
        f"/v1/requests/{req.id}/decision", json={"outcome": "approved"}, headers=bearer(TOKEN)
    )
    assert resp.status_code == 200 and resp.json()["status"] == "approved"
    assert ran == []  # no thread, no sync step
    run_id = api_broker.create_run("refunds", "p").id
    [ruled] = api_broker.create_round(run_id, 1, [NewRequest(tool_name="refund", args={})])
    resp = client.post(
        f"/v1/requests/{ruled.id}/decision",
        json={"outcome": "approved", "remember": 0},
        headers=bearer(TOKEN),
    )
    assert resp.status_code == 200, resp.text
    assert ran == ["sync"]  # a rule to keep: the sync face, in a thread


Case = Callable[[Broker], tuple[str, Decision, Principal, dict[str, Any]]]


def _new(broker: Broker, **fields: Any) -> str:
    return broker.create_request(NewRequest(tool_name="refund", args={"amount": 5}, **fields)).id


def approve(broker: Broker) -> tuple[str, Decision, Principal, dict[str, Any]]:
    return _new(broker), Decision(outcome=Outcome.approved), ALICE, {}


def reject_after_another_won(broker: Broker) -> tuple[str, Decision, Principal, dict[str, Any]]:
    rid = _new(broker)
    broker.decide(rid, Decision(outcome=Outcome.approved), decided_by="bob")
    return rid, Decision(outcome=Outcome.rejected, reason="no"), ALICE, {}


def repeat(broker: Broker) -> tuple[str, Decision, Principal, dict[str, Any]]:
    rid = _new(broker)
    broker.decide(rid, Decision(outcome=Outcome.rejected, reason="no"), decided_by="alice")
    return rid, Decision(outcome=Outcome.rejected, reason="no"), ALICE, {}


def escalate_to_the_default(broker: Broker) -> tuple[str, Decision, Principal, dict[str, Any]]:
    return _new(broker), Decision(outcome=Outcome.escalated), ALICE, {}


def first_vote(broker: Broker) -> tuple[str, Decision, Principal, dict[str, Any]]:
    return _new(broker, queue="pair"), Decision(outcome=Outcome.approved), ALICE, {}


def second_vote(broker: Broker) -> tuple[str, Decision, Principal, dict[str, Any]]:
    rid = _new(broker, queue="pair")
    Judge(broker).decide(rid, Decision(outcome=Outcome.approved), BOB, via=("inbox",))
    return rid, Decision(outcome=Outcome.approved), ALICE, {}


def creator_approves(broker: Broker) -> tuple[str, Decision, Principal, dict[str, Any]]:
    return _new(broker, created_by="alice"), Decision(outcome=Outcome.approved), ALICE, {}


def stale_args(broker: Broker) -> tuple[str, Decision, Principal, dict[str, Any]]:
    decision = Decision(outcome=Outcome.approved, args_hash="0" * 64)
    return _new(broker), decision, ALICE, {}


def replayed_marker(broker: Broker) -> tuple[str, Decision, Principal, dict[str, Any]]:
    rid = _new(broker)
    once = (broker.keys.seen("webhook", f"ops:{rid}"), 900)
    broker.decide(_new(broker), Decision(outcome=Outcome.approved), decided_by="x", once=once)
    return rid, Decision(outcome=Outcome.approved), ALICE, {"once": once}


def unknown(broker: Broker) -> tuple[str, Decision, Principal, dict[str, Any]]:
    return "req_nope", Decision(outcome=Outcome.approved), ALICE, {}


CASES: dict[str, Case] = {
    "approve": approve,
    "lost to another": reject_after_another_won,
    "a harmless repeat": repeat,
    "escalate to the queue's escalate_to": escalate_to_the_default,
    "first vote of two": first_vote,
    "the vote that meets the quorum": second_vote,
    "the creator's approval": creator_approves,
    "stale args_hash": stale_args,
    "a spent marker": replayed_marker,
    "an unknown id": unknown,
}


def answer(call: Callable[[], Any]) -> tuple[Any, ...]:
    """What a decision came to, comparable across two twin requests."""
    try:
        done = call()
    except BrokerError as exc:
        return ("refused", type(exc).__name__, exc.code)
    request = done.request
    return (done.recorded, request.status.value, request.queue, len(request.approvals))


def run_async(redis_url: str, judge_of: Callable[[Callable[[], Any]], Judge], **call: Any) -> Any:
    async def go() -> Any:
        client = connect_async(redis_url)
        try:
            return await judge_of(lambda: client).adecide(**call)
        finally:
            await client.aclose()

    return asyncio.run(go())


@pytest.mark.parametrize("case", list(CASES))
def test_the_async_face_answers_as_the_sync_face(
    case: str, redis: Redis, redis_url: str, cfg: Config
) -> None:
    broker = Broker(redis, cfg, prefix="t:")
    rid, decision, decider, extra = CASES[case](broker)
    sync = answer(lambda: Judge(broker).decide(rid, decision, decider, via=("inbox",), **extra))
    twin, decision, decider, extra = CASES[case](broker)

    def judge_of(client: Callable[[], Any]) -> Judge:
        judge = Judge(broker, async_redis=client)
        judge.decide = None  # type: ignore[method-assign, assignment]  # the async face only
        return judge

    call = {"request_id": twin, "decision": decision, "decider": decider, "via": ("inbox",)}
    assert answer(lambda: run_async(redis_url, judge_of, **call, **extra)) == sync


def test_the_async_face_asks_for_the_stream_of_a_queue_the_config_dropped(
    redis: Redis, redis_url: str
) -> None:
    old = parse_config({"queues": {"default": {"channels": ["inbox"]}, "gone": {}}})
    rid = (
        Broker(redis, old, prefix="t:")
        .create_request(NewRequest(tool_name="refund", args={}, queue="gone"))
        .id
    )
    now = Broker(redis, parse_config({"queues": {"default": {"channels": ["inbox"]}}}), prefix="t:")
    done = run_async(
        redis_url,
        lambda client: Judge(now, async_redis=client),
        request_id=rid,
        decision=Decision(outcome=Outcome.rejected, reason="gone"),
        decider=operator("root"),
        via=(),
    )
    assert done.recorded and done.request.status.value == "rejected"
    assert now.get_request(rid).status.value == "rejected"
