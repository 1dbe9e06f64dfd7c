"""The API's asyncio Redis client waits for a pooled connection instead of refusing at once.

redis.asyncio's default pool refuses the 101st command in flight (`MaxConnectionsError`), and
the API answers that with a 503: the agent bench's 200 long-polls reading their runs together
got 503s. `broker.redis.connection.connect_async` (what `Broker.async_reads` builds for the API)
holds up to ASYNC_CONNECTIONS and queues past that, for at most the client's socket timeout.
"""

from __future__ import annotations

import asyncio
import time

from redis import Redis

from broker.facade import Broker
from broker.redis.connection import connect_async

IN_FLIGHT = 300  # above redis.asyncio's default pool (100)


async def _reads_at_once(client: object, n: int) -> list[BaseException]:
    async def one(i: int) -> list[object]:
        async with client.pipeline(transaction=False) as pipe:  # type: ignore[attr-defined]
            pipe.hgetall(f"test:pool:{i}")
            pipe.smembers(f"test:pool:{i}:set")
            return await pipe.execute()  # type: ignore[no-any-return]

    try:
        got = await asyncio.gather(*(one(i) for i in range(n)), return_exceptions=True)
    finally:
        await client.aclose()  # type: ignore[attr-defined]
    return [r for r in got if isinstance(r, BaseException)]


def test_many_reads_at_once_on_a_url_client_all_succeed(redis_url: str) -> None:
    assert asyncio.run(_reads_at_once(connect_async(redis_url), IN_FLIGHT)) == []


def test_many_reads_at_once_on_the_apis_client_all_succeed(redis: Redis, broker: Broker) -> None:
    """The client the API builds from the broker's own (no APPROVAL_BROKER_REDIS_URL)."""
    client = broker.async_reads(None).client
    assert asyncio.run(_reads_at_once(client, IN_FLIGHT)) == []


BUSY_S = 1.5
"""How long the test keeps the event loop busy: longer than the old 1 s connect timeout."""


async def _reads_through_a_busy_loop(client: object, n: int) -> list[BaseException]:
    """`n` reads that each open a new connection, begun just before the loop is busy (CPU
    work: what a burst of thousands of requests on one API process is) for BUSY_S."""

    async def one(i: int) -> object:
        return await client.hgetall(f"test:busy:{i}")  # type: ignore[attr-defined]

    try:
        reads = [asyncio.create_task(one(i)) for i in range(n)]
        await asyncio.sleep(0)  # each read starts connecting, then waits for the loop
        time.sleep(BUSY_S)  # the busy loop itself, on purpose
        got = await asyncio.gather(*reads, return_exceptions=True)
    finally:
        await client.aclose()  # type: ignore[attr-defined]
    return [r for r in got if isinstance(r, BaseException)]


def test_new_connections_begun_before_the_loop_is_busy_for_a_while_still_succeed(
    redis_url: str,
) -> None:
    """A connection's timeout runs on the loop's clock: with a 1 s connect timeout, connections
    begun as 3,000 runs were started at once timed out while the loop worked through the
    burst, and their long-polls answered 503 although Redis was fine (`bench_agents.py --runs
    3000`). The connect timeout is the socket timeout (3 s) now; a stalled Redis still gives a
    503 within it (tests/system/test_redis_stall.py)."""
    assert asyncio.run(_reads_through_a_busy_loop(connect_async(redis_url), 50)) == []
