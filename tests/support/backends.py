"""Run a test module against a single Redis and against the local Redis Cluster (issue 19).

A module opts in by importing the fixtures below; they replace conftest's `redis`, `broker`
and `api_broker` for that module only, parametrised over `backend` ("single", "cluster"), so
its tests run twice and stay unchanged:

    from tests.support.backends import on_backend, on_backend_api_broker, on_backend_broker  # noqa: F401

On the cluster the broker's keys live on the cluster and RQ on a single Redis of its own, as
`Broker.from_settings` sets a clustered broker up. conftest imports the fixtures those build on
(`backend`, `rq_redis`, `new_redis`, `backend_env`, `make_broker_on`): they do nothing for a
module that does not opt in. A test that reads a raw key names the partition it is in
(`keys.of_request(id)`, `keys.of_run(id)`, `keys.parts()`); one that cannot run on the cluster
takes `@single_only` with a `# cluster: <reason>` comment.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from redis import Redis
from redis.cluster import RedisCluster

from broker.domain.config import Config
from broker.domain.settings import Settings
from broker.facade import Broker
from broker.redis.cluster import connect_cluster
from broker.runs.outbox import Handled, Resumer

BACKENDS = ("single", "cluster")

single_only = pytest.mark.parametrize("backend", ["single"])
"""For a test of a module on both backends that runs on the single Redis only (say why)."""

AnyRedis = Redis | RedisCluster


@pytest.fixture(name="backend", params=BACKENDS)
def backend_param(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(name="redis")
def on_backend(backend: str, request: pytest.FixtureRequest) -> Iterator[AnyRedis]:
    """The broker's Redis: a flushed database of the single Redis, or the flushed cluster."""
    if backend == "cluster":
        yield request.getfixturevalue("cluster_client")
        return
    client = Redis.from_url(request.getfixturevalue("redis_url"))
    yield client
    client.close()


@pytest.fixture(name="rq_redis")
def on_backend_rq(backend: str, redis: AnyRedis, request: pytest.FixtureRequest) -> AnyRedis:
    """Where RQ runs: the broker's own Redis, or (cluster) a flushed single Redis beside it."""
    if backend == "single":
        return redis
    client = Redis.from_url(request.getfixturevalue("redis_url"))
    request.addfinalizer(client.close)
    return client


@pytest.fixture(name="new_redis")
def on_backend_connect(
    backend: str, request: pytest.FixtureRequest
) -> Iterator[Callable[[], AnyRedis]]:
    """Opens another client on the test's backend (another thread's, another caller's)."""
    opened: list[AnyRedis] = []
    if backend == "cluster":
        url = request.getfixturevalue("redis_cluster").url

        def make() -> AnyRedis:
            opened.append(connect_cluster(url, patient=True))
            return opened[-1]
    else:
        url = request.getfixturevalue("redis_url")

        def make() -> AnyRedis:
            opened.append(Redis.from_url(url))
            return opened[-1]

    yield make
    for client in opened:
        client.close()


@pytest.fixture(name="backend_env")
def on_backend_env(backend: str, request: pytest.FixtureRequest) -> dict[str, str]:
    """The environment a role or the CLI connects to the test's backend with."""
    single = request.getfixturevalue("redis_url")  # the same database as `rq_redis`
    if backend == "single":
        return {"APPROVAL_BROKER_REDIS_URL": single}
    return {
        "APPROVAL_BROKER_REDIS_URL": request.getfixturevalue("redis_cluster").url,
        "APPROVAL_BROKER_REDIS_CLUSTER": "1",
        "APPROVAL_BROKER_RQ_REDIS_URL": single,
    }


def settings_for(env: dict[str, str], **more: Any) -> Settings:
    """The `Settings` that `backend_env` (APPROVAL_BROKER_* names) stands for, plus `more`."""
    values = {name.removeprefix("APPROVAL_BROKER_").lower(): v for name, v in env.items()}
    return Settings(**values, **more)


def broker_on(redis: AnyRedis, rq_redis: AnyRedis, config: Config, prefix: str = "t:") -> Broker:
    """A Broker on `redis` with RQ on `rq_redis` (the same client on a single Redis)."""
    broker = Broker(redis, config, prefix=prefix)  # type: ignore[arg-type]
    if rq_redis is not redis:
        broker.store.rq = rq_redis  # type: ignore[assignment]
    return broker


@pytest.fixture(name="make_broker_on")
def on_backend_make_broker(redis: AnyRedis, rq_redis: AnyRedis) -> Callable[..., Broker]:
    """Builds a Broker on the test's backend: `make_broker_on(config, prefix="t:")`."""

    def make(config: Config, prefix: str = "t:", client: AnyRedis | None = None) -> Broker:
        return broker_on(client if client is not None else redis, rq_redis, config, prefix)

    return make


@pytest.fixture(name="broker")
def on_backend_broker(make_broker_on: Callable[..., Broker], config: Config) -> Broker:
    return make_broker_on(config)


@pytest.fixture(name="api_broker")
def on_backend_api_broker(make_broker_on: Callable[..., Broker], cfg: Config) -> Broker:
    """For API tests: a broker on the module's `cfg` fixture, on the test's backend."""
    return make_broker_on(cfg)


def resume_once(broker: Broker, **options: Any) -> list[Handled]:
    """One read of every partition's outbox (one on a single Redis), as `run_forever` reads."""
    each = Resumer(broker, block_ms=None, **options).per_partition()
    return [handled for resumer in each for handled in resumer.run_once()]


def stream_entries(broker: Broker, queue: str = "default") -> list[tuple[bytes, dict]]:
    """Every entry of `queue`'s event stream, over every partition (one on a single Redis)."""
    return [e for keys in broker.keys.parts() for e in broker.redis.xrange(keys.stream(queue))]
