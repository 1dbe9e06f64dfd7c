"""The commands a busy API sends for its decisions (the request reads, `Decisions.aread`, and
the decide steps, `Scripts.arun`) and the runs its long-polls read (`AsyncReads.run`) go to
Redis together: those of one pass of the event loop are one round trip, and each caller gets
its own reply, or its own error (`broker.store.coalesced`). The module has a Redis of its own:
Redis counts round trips server-wide."""

from __future__ import annotations

import asyncio
from typing import Any

from broker.domain.errors import Conflict, NotFound
from broker.domain.models import Decision, NewRequest, Outcome, Status
from broker.domain.principals import operator
from broker.facade import Broker
from broker.judge import Judge
from broker.redis.connection import connect_async
from broker.runs.agents import register_agent
from broker.runs.starting import start_run
from tests.support.counted_redis import redis_server  # noqa: F401 - counts need a Redis of their own


async def _read_together(broker: Broker, url: str, ids: list[str]) -> tuple[list[Any], int]:
    """Each id read by its own task, all at once; the round trips Redis counted for them."""
    client = connect_async(url)
    try:
        before = (await client.info("stats"))["total_reads_processed"]
        got = await asyncio.gather(
            *(broker.decisions.aread(client, rid) for rid in ids), return_exceptions=True
        )
        after = (await client.info("stats"))["total_reads_processed"]
    finally:
        await client.aclose()
    return got, after - before - 1  # less the second INFO


def test_the_reads_of_one_pass_of_the_loop_are_one_round_trip(
    broker: Broker, redis_url: str
) -> None:
    ids = [
        broker.create_request(NewRequest(tool_name="refund", args={"i": i})).id for i in range(5)
    ]
    got, trips = asyncio.run(_read_together(broker, redis_url, [*ids, "req_missing"]))
    assert trips == 1
    assert [r.id for r in got[:5]] == ids
    assert [r.args for r in got[:5]] == [{"i": i} for i in range(5)]
    assert isinstance(got[5], NotFound)


def test_a_read_alone_is_one_command_and_a_caller_that_goes_away_leaves_the_others(
    broker: Broker, redis_url: str
) -> None:
    first = broker.create_request(NewRequest(tool_name="refund", args={"i": 1})).id
    second = broker.create_request(NewRequest(tool_name="refund", args={"i": 2})).id

    async def scenario() -> tuple[str, str, bool]:
        client = connect_async(redis_url)
        try:
            alone = await broker.decisions.aread(client, first)
            leaving = asyncio.ensure_future(broker.decisions.aread(client, first))
            staying = asyncio.ensure_future(broker.decisions.aread(client, second))
            await asyncio.sleep(0)  # both are waiting for the batch now
            leaving.cancel()
            kept = await staying
            return alone.id, kept.id, leaving.cancelled()
        finally:
            await client.aclose()

    assert asyncio.run(scenario()) == (first, second, True)


def test_concurrent_decisions_are_a_round_trip_for_their_reads_and_one_for_their_steps(
    broker: Broker, redis_url: str
) -> None:
    """Five decisions at once: their reads in one round trip, their steps in the next; each
    recorded as its own, and the one that lost its race (decided already) gets its conflict."""
    ids = [
        broker.create_request(NewRequest(tool_name="refund", args={"i": i})).id for i in range(5)
    ]
    Judge(broker).decide(ids[4], Decision(outcome=Outcome.rejected), operator("root"), via=())

    async def decide_all() -> tuple[list[Any], int]:
        client = connect_async(redis_url)
        judge = Judge(broker, async_redis=lambda: client)
        try:
            before = (await client.info("stats"))["total_reads_processed"]
            got = await asyncio.gather(
                *(
                    judge.adecide(rid, Decision(outcome=Outcome.approved), operator("root"), via=())
                    for rid in ids
                ),
                return_exceptions=True,
            )
            after = (await client.info("stats"))["total_reads_processed"]
        finally:
            await client.aclose()
        return got, after - before - 1

    got, trips = asyncio.run(decide_all())
    assert trips == 2
    assert [d.request.status for d in got[:4]] == [Status.approved] * 4
    assert isinstance(got[4], Conflict)
    assert broker.get_request(ids[4]).status is Status.rejected


def test_run_reads_go_with_the_request_reads_of_the_same_pass_in_one_round_trip(
    broker: Broker, redis_url: str
) -> None:
    """Three runs, a run that does not exist and a request, each read by its own task at
    once: one round trip; a run read whose caller went away leaves the others their answers."""
    register_agent(broker, "refunds", "refunds_demo:agent", deps="refunds_demo:make_deps")
    runs = [
        start_run(broker, "refunds", f"refund order {i}", started_by="svc").id for i in range(3)
    ]
    request = broker.create_request(NewRequest(tool_name="refund", args={"i": 0})).id

    async def read_together() -> tuple[list[Any], int, bool]:
        reads = broker.async_reads(redis_url)
        try:
            before = (await reads.client.info("stats"))["total_reads_processed"]
            leaving = asyncio.ensure_future(reads.run(runs[0]))
            got = asyncio.gather(
                *(reads.run(run_id) for run_id in [*runs, "run_missing"]),
                broker.decisions.aread(reads.client, request),
                return_exceptions=True,
            )
            await asyncio.sleep(0)  # every read is waiting for the batch now
            leaving.cancel()
            answers = await got
            after = (await reads.client.info("stats"))["total_reads_processed"]
        finally:
            await reads.aclose()
        return answers, after - before - 1, leaving.cancelled()

    got, trips, cancelled = asyncio.run(read_together())
    assert trips == 1 and cancelled
    assert [(run.id, run.status.value, starter) for run, starter in got[:3]] == [
        (run_id, "queued", "svc") for run_id in runs
    ]
    assert isinstance(got[3], NotFound)
    assert got[4].id == request
