"""The hot path's batching keeps its promises: fewer round trips, the same outcomes."""

from __future__ import annotations

from redis import Redis

from broker.domain.config import Config
from broker.domain.events import parse_entry
from broker.domain.models import Decision, HistoryEntry, NewRequest, RunStatus, utcnow
from broker.facade import Broker
from broker.redis.replies import as_str as text
from broker.runs.agent_runner import AgentRunner
from broker.runs.agents import register_agent
from broker.runs.outbox import Resumer
from broker.runs.starting import resume_job_id, run_queue, start_run
from broker.store.keys import NOTIFIER_GROUP, RESUMER_GROUP
from notifiers.commit import Committer
from notifiers.parking import ParkedStore
from notifiers.results import DeliveryResult, ResultKind
from notifiers.tasks import InflightEntry
from tests.support.counted_redis import (
    redis_server,  # noqa: F401 - counts need a Redis of their own
    round_trips,
)
from tests.support.waiting import wait_for


def script_calls(redis: Redis, command: str) -> int:
    stats = redis.info("commandstats")
    return int(stats.get(f"cmdstat_script|{command}", {}).get("calls", 0))


def pipeline_note(broker: Broker, request_id: str, detail: str) -> None:
    pipe = broker.redis.pipeline(transaction=False)
    broker.add_history(
        request_id, HistoryEntry(at=utcnow(), event="note", detail=detail), pipe=pipe
    )
    pipe.execute()


def test_scripts_in_pipelines_send_no_script_exists(broker: Broker, redis: Redis) -> None:
    [request] = broker.create_requests([NewRequest(tool_name="refund", args={})])
    before = script_calls(redis, "exists")
    for i in range(5):
        pipeline_note(broker, request.id, f"n{i}")
    assert script_calls(redis, "exists") == before
    assert [h.detail for h in broker.get_request(request.id).history] == [f"n{i}" for i in range(5)]


def test_scripts_come_back_after_a_flush_and_after_a_reconnect(
    broker: Broker, redis: Redis
) -> None:
    broker.create_requests([NewRequest(tool_name="refund", args={})])
    redis.script_flush()
    [alone] = broker.create_requests([NewRequest(tool_name="refund", args={})])  # NOSCRIPT, reload
    redis.script_flush()
    redis.connection_pool.disconnect()  # what a Redis restart does to every connection
    pipeline_note(broker, alone.id, "after reconnect")  # loaded again on connecting
    assert broker.get_request(alone.id).history[-1].detail == "after reconnect"


def test_a_batch_of_outbox_entries_costs_a_fixed_number_of_round_trips(
    redis_url: str, config: Config
) -> None:
    broker = Broker(Redis.from_url(redis_url), config, prefix="t:")
    runs = [broker.create_run("refunds", "p").id for _ in range(50)]
    broker.ensure_group(broker.keys.resumes, RESUMER_GROUP)
    resumer = Resumer(broker, consumer="r", block_ms=None)
    first = runs.pop()
    broker.redis.xadd(broker.keys.resumes, {"run_id": first, "round": "1"})
    assert [h.action for h in resumer.run_once()] == ["enqueued"]  # connections made, once
    for run_id in runs:
        broker.redis.xadd(broker.keys.resumes, {"run_id": run_id, "round": "1"})
    before = round_trips(broker.redis)
    handled = resumer.run_once()
    trips = round_trips(broker.redis) - before - 1  # the INFO above is one
    assert [h.action for h in handled] == ["enqueued"] * 49
    # the read, WATCH, the claim step and one MULTI/EXEC of RQ's enqueue_many (Redis counts
    # that pipeline's ~30 KB as a few socket reads, more when a busy machine hands it over in
    # smaller pieces); one by one, 49 entries took about 300
    assert trips <= 12
    assert sorted(run_queue(broker).job_ids) == sorted(resume_job_id(r, 1) for r in [first, *runs])
    assert broker.redis.xpending(broker.keys.resumes, RESUMER_GROUP)["pending"] == 0


def test_a_batch_with_one_failing_delivery_acks_only_the_others(broker: Broker) -> None:
    stream = broker.keys.stream("default")
    broker.redis.xgroup_create(stream, NOTIFIER_GROUP, id="0", mkstream=True)
    made = broker.create_requests([NewRequest(tool_name="refund", args={"i": i}) for i in range(3)])
    [(_, raw)] = broker.redis.xreadgroup(NOTIFIER_GROUP, "n1", {stream: ">"}, count=10)
    entries = []
    for eid, fields in raw:
        event = parse_entry(
            stream, "default", text(eid), {text(k): text(v) for k, v in fields.items()}
        )
        entries.append(InflightEntry(event, None, remaining={"webhook:x"}))
    acked: list[InflightEntry] = []
    committer = Committer(
        broker, acked.extend, ParkedStore(broker, 30.0), on_fatal=lambda why: None
    )
    failing = entries[1]
    try:
        for entry in entries:
            kind = ResultKind.attempt_failed if entry is failing else ResultKind.delivered
            committer.put(DeliveryResult(entry, kind, "webhook:x", "webhook", "HTTP 200"))
        wait_for(lambda: len(acked) == 2)
    finally:
        committer.close()
    pending = broker.redis.xpending_range(stream, NOTIFIER_GROUP, "-", "+", 10)
    assert [text(p["message_id"]) for p in pending] == [failing.event.entry_id]
    by_id = {r.id: r for r in made}
    for entry in entries:
        events = [h.event for h in broker.get_request(entry.event.request_id).history]
        assert ("delivered" in events) is (entry is not failing), by_id[entry.event.request_id]
    stats = {text(k): int(v) for k, v in broker.redis.hgetall(broker.keys.stats).items()}
    assert stats["delivered:webhook"] == 2 and stats["failed:webhook"] == 1


def test_brokers_made_per_job_on_one_client_load_the_scripts_once(
    redis: Redis, config: Config
) -> None:
    Broker(redis, config, prefix="t:").create_requests([NewRequest(tool_name="refund", args={})])
    hook, loads = redis.get_connection_kwargs()["redis_connect_func"], script_calls(redis, "load")
    for _ in range(20):  # what `broker.runs.agent_jobs.broker_on` does for each job
        Broker(redis, config, prefix="t:").create_requests([NewRequest(tool_name="r", args={})])
    assert redis.get_connection_kwargs()["redis_connect_func"] is hook  # no chain of hooks
    assert script_calls(redis, "load") == loads


def test_a_runs_two_rounds_cost_a_fixed_number_of_round_trips(broker: Broker, redis: Redis) -> None:
    """Round 0 (start to pause) and round 1 (approved, the tool runs, the run finishes) of a
    one-tool run, driven by the runner alone: the run's fields, history and round requests come
    in one round trip, what the job read already (the run's agent, its starter, its round) is
    not read again to register the round or to expire the ended run, and each step of a round
    is one write (the marker with the tool's count, the checkpoint, the end)."""
    register_agent(broker, "refund", "tests.support.slot_agents:refund_agent", deps="tests.support.agents:make_recorder")  # fmt: skip
    runner = AgentRunner(broker)

    def cycle() -> tuple[int, int]:
        run = start_run(broker, "refund", "Refund A1.")
        before = round_trips(redis)
        assert runner.advance(run.id, 0) == RunStatus.waiting.value
        first = round_trips(redis) - before
        [request] = broker.round_requests(run.id, 1)
        broker.decide(request.id, Decision(outcome="approved"), decided_by="bob")
        before = round_trips(redis)
        assert runner.advance(run.id, 1) == RunStatus.finished.value
        return first, round_trips(redis) - before

    cycle()  # scripts loaded, the agent's registration read and cached
    # the least of three cycles: on a busy machine Redis may take one request in two socket
    # reads now and then (a CI run once counted 12 for the first round); a round trip too
    # many in the code shows in every cycle
    counts = [cycle() for _ in range(3)]
    first, second = min(c[0] for c in counts), min(c[1] for c in counts)
    # 10 and 12 when each step wrote the run's status, its marker, each tool's count, the
    # tool's return and the checkpoint apart, and the round's requests were read after the run
    assert first <= 8, counts
    assert second <= 7, counts
