"""A Redis of a test module's own, for tests that count commands.

Redis counts commands server-wide (`INFO commandstats` keeps no count per client), so on the
session's shared Redis a client another test left behind (a server thread still closing, an RQ
worker still exiting) would add to a test's sums. A module that counts imports this fixture:

    from tests.support.counted_redis import redis_server  # noqa: F401 - the module's own Redis
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from redis import Redis

from broker.redis.embedded import EmbeddedRedis


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    """Overrides the session's `redis_server` for one module."""
    with EmbeddedRedis(tmp_path_factory.mktemp("redis-counted")) as server:
        yield server


def round_trips(redis: Redis) -> int:
    """Every client's round trips so far, as Redis counts them: one read per command sent alone
    or per pipeline (a pipeline larger than Redis's read buffer takes a few). This INFO is one."""
    return int(redis.info("stats")["total_reads_processed"])


def calls(redis: Redis, command: str) -> int:
    """How many times the server ran `command` so far (INFO commandstats)."""
    stats: dict[str, Any] = redis.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))
