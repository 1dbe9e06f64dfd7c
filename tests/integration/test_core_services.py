"""The Broker facade over its services: the same public surface, one round trip per decision,
and steps that ask again for a key the stored fields turned out to need."""

from __future__ import annotations

import inspect
import json
import time
from typing import Any

import pytest
from redis import Redis

from broker.domain.config import Config, parse_config
from broker.domain.errors import Conflict
from broker.domain.models import Decision, HistoryEntry, NewRequest, RunStatus, Status, utcnow
from broker.facade import Broker
from broker.store import decide_step as decisions_module
from broker.store import sweeping as sweeping_module
from tests.support.decisions import race

PUBLIC = {
    "from_settings": [],
    "create_request": ["new"],
    "create_requests": ["news"],
    "create_round": ["run_id", "round_no", "calls"],
    "get_request": ["request_id"],
    "get_requests": ["ids"],
    "list_requests": ["status", "queue", "limit"],
    "round_requests": ["run_id", "round_no"],
    "add_history": ["request_id", "entry"],
    "decide": ["request_id", "decision", "decided_by", "in_queue", "once"],
    "escalate": ["request_id", "target", "reason", "decided_by", "args_hash", "once"],
    "sweep": ["now", "limit"],
    "create_run": ["agent", "prompt", "run_id", "extra"],
    "counts": [],
    "run_fields": ["run_id"],
    "get_run": ["run_id"],
    "update_run": ["run_id", "fields"],
    "save_messages": ["run_id", "messages_json"],
    "load_messages": ["run_id"],
    "ensure_group": ["stream", "group"],
    "dead_letter": ["source", "error", "stream", "entry", "extra"],
    "redrive": ["entry_id"],
    "dead_letters": ["count"],
}


def test_the_facade_keeps_every_public_method_and_attribute(broker: Broker) -> None:
    for name, params in PUBLIC.items():
        signature = inspect.signature(getattr(broker, name))
        assert [p for p in signature.parameters if p not in ("settings", "config", "patient")][
            : len(params)
        ] == params, name
    for attr in ("redis", "config", "keys", "scripts", "maxlen", "retention"):
        assert getattr(broker, attr) is not None
    for service in ("once", "reason_prompts", "idempotency", "fleet", "audit", "rq_connection"):
        assert getattr(broker, service) is not None  # what the roles and channels reach


def counting(broker: Broker) -> list[str]:
    """Record every command the broker's client sends."""
    sent: list[str] = []
    real = broker.redis.execute_command

    def execute(*args: Any, **options: Any) -> Any:
        sent.append(str(args[0]))
        return real(*args, **options)

    broker.redis.execute_command = execute  # type: ignore[method-assign]
    return sent


def test_a_decision_is_one_round_trip_and_so_is_a_refused_one(broker: Broker) -> None:
    warm, request = broker.create_requests([NewRequest(tool_name="w"), NewRequest(tool_name="t")])
    broker.decide(warm.id, Decision(outcome="approved"), decided_by="a")  # loads the script
    sent = counting(broker)
    done = broker.decide(request.id, Decision(outcome="approved"), decided_by="a")
    assert done == broker.get_request(request.id) and done.status is Status.approved
    with pytest.raises(Conflict) as info:
        broker.decide(request.id, Decision(outcome="rejected"), decided_by="b")
    assert info.value.request.decision.decided_by == "a"
    assert sent == ["EVALSHA", "HGETALL", "EVALSHA"]


@pytest.fixture
def with_old_queue(redis: Redis, config: Config) -> tuple[Broker, Broker]:
    """A broker whose config still has queue `old`, and one whose config dropped it."""
    raw: dict[str, Any] = {
        "queues": {
            "default": {"timeout_s": 600, "escalate_to": "managers"},
            "managers": {"timeout_s": 1800},
            "old": {"timeout_s": 5},
        }
    }
    before = Broker(redis, parse_config(raw), prefix="t:")
    del raw["queues"]["old"]
    return before, Broker(redis, parse_config(raw), prefix="t:")


def test_a_request_left_in_a_dropped_queue_can_still_be_decided_once(
    with_old_queue: tuple[Broker, Broker], redis_url: str
) -> None:
    before, after = with_old_queue
    request = before.create_request(NewRequest(tool_name="t", queue="old"))

    def decide(i: int) -> Any:
        own = Broker(Redis.from_url(redis_url), after.config, prefix="t:")
        return own.decide(request.id, Decision(outcome="approved"), decided_by=f"u{i}")

    results = race(20, decide)
    wins = [r for r in results if not isinstance(r, Exception)]
    assert len(wins) == 1 and all(isinstance(r, Conflict) for r in results if r not in wins)
    events = after.redis.xrange(after.keys.stream("old"))
    assert [e[1][b"type"] for e in events] == [b"approval.requested", b"approval.decided"]


def test_a_request_left_in_a_dropped_queue_times_out(with_old_queue: tuple[Broker, Broker]):
    before, after = with_old_queue
    request = before.create_request(NewRequest(tool_name="t", queue="old"))
    [result] = after.sweep(now=time.time() + 10)
    assert (result.request_id, result.action, result.from_queue) == (request.id, "timed_out", "old")
    events = after.redis.xrange(after.keys.stream("old"))
    assert events[-1][1][b"type"] == b"approval.timed_out"


@pytest.mark.parametrize("how", ["decide", "sweep"])
def test_a_step_asks_for_the_run_keys_when_the_id_does_not_name_the_run(
    broker: Broker, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """Without the run from the id, the step names the run it needs; the round still resumes."""
    monkeypatch.setattr(decisions_module, "run_of_request", lambda _: None)
    monkeypatch.setattr(sweeping_module, "run_of_request", lambda _: None)
    broker.config.queues["managers"].timeout_s = 1
    broker.create_run("agent", "go", run_id="r1")
    a, b = broker.create_round("r1", 1, [NewRequest(tool_name="x"), NewRequest(tool_name="y")])
    broker.decide(a.id, Decision(outcome="rejected", reason="no"), decided_by="u")
    if how == "decide":
        broker.decide(b.id, Decision(outcome="approved"), decided_by="u")
    else:
        broker.redis.zadd(broker.keys.expiry, {b.id: 0}, xx=True)
        broker.config.queues["default"].escalate_to = None
        [result] = broker.sweep()
        assert result.action == "timed_out"
    outbox = broker.redis.xrange(broker.keys.resumes)
    assert [(f[b"run_id"], f[b"round"]) for _, f in outbox] == [(b"r1", b"1")]
    run = broker.get_run("r1")
    assert run.status is RunStatus.queued and run.pending == []


def test_history_notes_queue_on_a_pipeline_in_both_call_forms(broker: Broker) -> None:
    request = broker.create_request(NewRequest(tool_name="t"))
    entry = HistoryEntry(at=utcnow(), event="delivered", channel="inbox")
    pipe = broker.redis.pipeline(transaction=False)
    broker.add_history(request.id, entry, pipe=pipe)
    legacy = json.dumps({"at": utcnow().isoformat(), "event": "delivery_failed", "channel": "x"})
    broker.scripts.note(args=[broker.keys.prefix, request.id, legacy], client=pipe)
    broker.scripts.note(args=[broker.keys.prefix, "req_missing", legacy], client=pipe)
    assert broker.get_request(request.id).history == []  # queued, not sent
    assert pipe.execute() == [1, 1, 0]
    events = [h.event for h in broker.get_request(request.id).history]
    assert events == ["delivered", "delivery_failed"]
    assert not broker.redis.exists(broker.keys.request("req_missing"))
