"""A run's writes on a Redis that failed over: the steps that wait for no replica, and the end.

A Redis master that fails over before its replica has the last writes loses writes it had
acknowledged. A run's steps wait for no replica: when one's log entry is lost, the attempt still
holds the whole history, so the step after it, seeing the log's length in its own MULTI, writes
the log again as one entry with the stage standing on it. Without that, the stage named more
entries than the log had, and the run could not be read again ("the run's log has 2 entries, its
stage needs 3"), as a run on a Redis Cluster whose masters were killed once showed. A run's end
is its attempt's last write, which no later step would check: on a cluster it waits for a
replica, as the run's start does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    UserPromptPart,
)
from redis.cluster import RedisCluster

from broker.domain.models import RunStatus
from broker.facade import Broker
from broker.redis.local_cluster import LocalCluster
from broker.runs.agent_runner_writes import RoundWrites
from broker.runs.agents import register_agent
from broker.runs.pause import CONTINUE, TOOLS, WAITING, Pause, RunLog
from broker.runs.starting import start_run
from tests.support.agents import FLAKY
from tests.support.backends import on_backend, on_backend_broker, single_only  # noqa: F401
from tests.support.counted_redis import calls
from tests.support.jobs import work

cluster_only = pytest.mark.parametrize("backend", ["cluster"])

Write = Callable[[RoundWrites, Pause, list[ModelMessage]], object]


def _history(turns: int) -> list[ModelMessage]:
    messages: list[ModelMessage] = []
    for n in range(turns):
        messages.append(ModelRequest(parts=[UserPromptPart(content=f"turn {n}")]))
        messages.append(ModelResponse(parts=[TextPart(content=f"answer {n}")]))
    return messages


def _lost_and_written_again(broker: Broker, write: Write) -> None:
    register_agent(broker, "effects", "tests.support.agents:effects_agent")
    run_id = start_run(broker, "effects", "Take a note, then pay.").id
    history = _history(4)
    writes = RoundWrites(broker, run_id, RunLog(), running=False)
    write(writes, Pause(0, TOOLS), history[:2])
    write(writes, Pause(0, CONTINUE), history[:4])
    log_key = broker.keys.run_log(run_id)
    assert broker.redis.llen(log_key) == 2
    broker.redis.rpop(log_key)  # the entry a failed-over master had not passed on

    whole = history[:6]
    write(writes, Pause(1, WAITING, calls=[{"tool_call_id": "c1"}]), whole)

    read = broker.run_store.read_round(run_id, 1)
    pause = Pause.read(read.fields, read.log, read.legacy)
    assert pause is not None
    assert (pause.round, pause.stage, pause.messages) == (1, WAITING, len(whole))
    assert ModelMessagesTypeAdapter.validate_json(pause.history_json) == whole

    write(writes, Pause(1, TOOLS), history)  # the next step stands on it
    read = broker.run_store.read_round(run_id, 1)
    pause = Pause.read(read.fields, read.log, read.legacy)
    assert pause is not None
    assert ModelMessagesTypeAdapter.validate_json(pause.history_json) == history
    assert len(read.log) == 2


def test_a_step_on_a_log_that_lost_an_acknowledged_entry_writes_the_log_again_whole(
    broker: Broker,
) -> None:
    _lost_and_written_again(broker, lambda writes, pause, messages: writes.write(pause, messages))


@single_only  # cluster: a run's steps stay on the sync client, in a thread
def test_a_step_on_the_loop_client_finds_a_lost_entry_and_writes_the_log_again_whole(
    broker: Broker,
) -> None:
    def write(writes: RoundWrites, pause: Pause, messages: list[ModelMessage]) -> None:
        assert writes.on_loop
        asyncio.run(writes.awrite(pause, messages))

    _lost_and_written_again(broker, write)


@cluster_only  # a single Redis has no replica to wait for
def test_a_runs_end_on_a_cluster_waits_for_a_replica(
    bound: Broker, backend: str, cluster_client: RedisCluster, redis_cluster: LocalCluster
) -> None:
    FLAKY["failures_left"] = 0
    register_agent(bound, "flaky", "tests.support.agents:flaky_agent")
    run_id = start_run(bound, "flaky", "Say something.").id  # waits for a replica itself
    master = cluster_client.get_node_from_key(bound.keys.run(run_id))
    node = next(n for n in redis_cluster.nodes if n.port == master.port).client()
    waits_before = calls(node, "wait")

    work(bound)

    assert bound.get_run(run_id).status is RunStatus.finished
    assert calls(node, "wait") - waits_before == 1
    node.close()
