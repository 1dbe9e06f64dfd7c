"""The fleet worker checks an approved call's receipt just before its tool runs.

A real agent run on an in-process RQ worker (the worker's own code path: `AgentRunner` and its
`ToolGuard`), paused for approval and decided through the broker; the receipt or the decision
is then changed in Redis as an attacker with write access would, and the resume must not run
the tool. The model is told the approval could not be verified; the refusal is an event, a
history entry and a counter.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from redis import Redis

from broker.audit.trail import AuditTrail
from broker.domain.models import Decision, RunStatus
from broker.domain.receipts import REFUSED_TEXT, ReceiptRefused
from broker.facade import Broker
from broker.receipts.checks import ReceiptChecks
from broker.runs.agent_runner_writes import RoundWrites
from broker.runs.agents import register_agent
from broker.runs.starting import enqueue_resume, start_run
from tests.support.agents import Recorder, recorder_for
from tests.support.jobs import jobs_bound_to, work
from tests.support.receipts import key_file, receipts_config

SUPPORT = "tests.support.slot_agents"


@pytest.fixture
def key(tmp_path: Path) -> Path:
    return key_file(tmp_path)


def _broker(redis: Redis, key: Path, **receipts: object) -> Broker:
    from broker.domain.config import parse_config

    return Broker(redis, parse_config(receipts_config(key, **receipts)), prefix="t:")


def _paused_run(broker: Broker) -> tuple[str, str]:
    """A refund run waiting for approval of its one call: (run id, request id)."""
    register_agent(broker, "refund", f"{SUPPORT}:refund_agent", deps="tests.support.agents:make_recorder")  # fmt: skip
    run = start_run(broker, "refund", "Refund A1.")
    work(broker)
    paused = broker.get_run(run.id)
    assert paused.status is RunStatus.waiting, paused.error
    return run.id, paused.pending[0]


def _resume(broker: Broker, run_id: str) -> None:
    enqueue_resume(broker, run_id, 1)
    work(broker)


def _model_saw(broker: Broker, run_id: str) -> str:
    return broker.load_messages(run_id).decode()


def _refusals(broker: Broker) -> dict[str, int]:
    return {k: v for k, v in broker.counts().items() if k.startswith("receipt_refused:")}


def _audited(broker: Broker, rid: str) -> list[tuple[str, str]]:
    """The receipt entries of `rid` in the audit trail: (event, detail)."""
    return [
        (e.event, e.detail)
        for e in AuditTrail(broker.redis, broker.keys).entries()
        if e.request_id == rid and e.event.startswith("receipt_")
    ]


def _events(broker: Broker) -> list[dict[str, str]]:
    out = []
    for _, fields in broker.redis.xrange(broker.keys.stream("default")):
        out.append({k.decode(): v.decode() for k, v in fields.items()})
    return [e for e in out if e["type"] == "approval.receipt_refused"]


@pytest.fixture
def recorder(redis: Redis) -> Recorder:
    return recorder_for(redis, "t:")


def test_an_approved_call_runs_on_its_receipt_and_spends_it(
    redis: Redis, key: Path, recorder: Recorder
) -> None:
    broker = _broker(redis, key)
    with jobs_bound_to(broker):
        run_id, rid = _paused_run(broker)
        decided = broker.decide(rid, Decision(outcome="approved"), decided_by="ann")
        assert decided.decision is not None and decided.decision.receipt
        _resume(broker, run_id)
    assert broker.get_run(run_id).status is RunStatus.finished
    assert [c["tool"] for c in recorder.all()] == ["refund"]
    assert broker.counts().get("receipt_spent") == 1
    assert [h.event for h in broker.get_request(rid).history][-1] == "receipt_spent"
    assert _audited(broker, rid) == [("receipt_spent", "")]


@pytest.mark.parametrize("on_loop", [True, False], ids=["loop client", "thread"])
def test_an_approved_call_runs_after_redis_forgot_its_scripts(
    redis: Redis, key: Path, recorder: Recorder, monkeypatch: pytest.MonkeyPatch, on_loop: bool
) -> None:
    """A restarted or failed-over Redis knows no scripts: the tool step's MULTI (its marker and
    the receipt's spend, a script) loads them and is taken again, once, and the tool runs once;
    on the loop's asyncio client (a single Redis) and in a thread (a cluster, a test double)."""
    monkeypatch.setattr(RoundWrites, "on_loop", property(lambda self: on_loop))
    broker = _broker(redis, key)
    with jobs_bound_to(broker):
        run_id, rid = _paused_run(broker)
        broker.decide(rid, Decision(outcome="approved"), decided_by="ann")
        redis.script_flush()
        _resume(broker, run_id)
    run = broker.get_run(run_id)
    assert run.status is RunStatus.finished, run.error
    assert [c["tool"] for c in recorder.all()] == ["refund"]
    assert broker.counts().get("receipt_spent") == 1
    assert _audited(broker, rid) == [("receipt_spent", "")]


def test_a_receipt_tampered_in_redis_does_not_run_the_tool(
    redis: Redis, key: Path, recorder: Recorder
) -> None:
    broker = _broker(redis, key)
    with jobs_bound_to(broker):
        run_id, rid = _paused_run(broker)
        broker.decide(rid, Decision(outcome="approved"), decided_by="ann")
        stored = json.loads(redis.hget(broker.keys.request(rid), "decision"))
        head, body, sig = stored["receipt"].split(".")
        stored["receipt"] = f"{head}.{body}.{sig[:-4]}AAAA"
        redis.hset(broker.keys.request(rid), "decision", json.dumps(stored))
        _resume(broker, run_id)
    assert recorder.all() == []
    assert REFUSED_TEXT in _model_saw(broker, run_id)
    assert _refusals(broker) == {"receipt_refused:bad_signature": 1}
    assert [e["reason"] for e in _events(broker)] == ["bad_signature"]
    assert _audited(broker, rid) == [("receipt_refused", "bad_signature")]


def test_args_changed_in_redis_after_approval_do_not_run(
    redis: Redis, key: Path, recorder: Recorder
) -> None:
    broker = _broker(redis, key)
    with jobs_bound_to(broker):
        run_id, rid = _paused_run(broker)
        broker.decide(rid, Decision(outcome="approved"), decided_by="ann")
        stored = json.loads(redis.hget(broker.keys.request(rid), "decision"))
        # turned into a modification the approver never made, keeping the real receipt
        stored.update(outcome="modified", args={"order": "A9"})
        redis.hset(broker.keys.request(rid), mapping={"decision": json.dumps(stored), "status": "modified"})  # fmt: skip
        _resume(broker, run_id)
    assert recorder.all() == []
    assert _refusals(broker) == {"receipt_refused:args_changed": 1}


def test_a_modified_call_runs_on_the_receipt_of_its_new_args(
    redis: Redis, key: Path, recorder: Recorder
) -> None:
    broker = _broker(redis, key)
    with jobs_bound_to(broker):
        run_id, rid = _paused_run(broker)
        modified = Decision(outcome="modified", args={"order": "A2"})
        broker.decide(rid, modified, decided_by="ann")
        _resume(broker, run_id)
    assert broker.get_run(run_id).status is RunStatus.finished
    assert [c["tool"] for c in recorder.all()] == ["refund"]
    assert _refusals(broker) == {}


def test_another_requests_receipt_is_refused(redis: Redis, key: Path, recorder: Recorder) -> None:
    broker = _broker(redis, key)
    with jobs_bound_to(broker):
        first_run, first = _paused_run(broker)
        run_id, rid = _paused_run(broker)
        broker.decide(first, Decision(outcome="approved"), decided_by="ann")
        broker.decide(rid, Decision(outcome="approved"), decided_by="ann")
        other = redis.hget(broker.keys.request(first), "decision")
        redis.hset(broker.keys.request(rid), "decision", other)
        _resume(broker, run_id)
    assert recorder.all() == []
    assert _refusals(broker) == {"receipt_refused:other_request": 1}


def test_a_spent_receipt_replayed_is_refused(redis: Redis, key: Path, recorder: Recorder) -> None:
    broker = _broker(redis, key)
    with jobs_bound_to(broker):
        run_id, rid = _paused_run(broker)
        broker.decide(rid, Decision(outcome="approved"), decided_by="ann")
        _resume(broker, run_id)
    assert len(recorder.all()) == 1
    request = broker.get_request(rid)
    with pytest.raises(ReceiptRefused) as refused:  # the same receipt, at another runner
        ReceiptChecks(broker).spend(request, tool_name="refund", args={"order": "A1"})
    assert refused.value.reason == "spent"
    assert _refusals(broker) == {"receipt_refused:spent": 1}


def test_an_approver_removed_from_config_with_recheck_roles_does_not_run(
    redis: Redis, key: Path, recorder: Recorder
) -> None:
    broker = _broker(redis, key, recheck_roles=True)
    with jobs_bound_to(broker):
        run_id, rid = _paused_run(broker)
        broker.decide(rid, Decision(outcome="approved"), decided_by="ann")
    raw = receipts_config(key, recheck_roles=True)
    del raw["approvers"]["ann"]
    from broker.domain.config import parse_config

    now = Broker(redis, parse_config(raw), prefix="t:")
    with jobs_bound_to(now):
        _resume(now, run_id)
    assert recorder.all() == []
    assert _refusals(now) == {"receipt_refused:approver_revoked": 1}
    assert REFUSED_TEXT in _model_saw(now, run_id)
