"""Test harness: one real Redis for the session, started by the broker's own launcher.

Each test gets a fresh database on it (flushed first) and a broker with its own key prefix;
no test depends on a Redis already running.
"""

from __future__ import annotations

import copy
import itertools
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from redis import Redis

from broker.domain.config import Config, parse_config
from broker.domain.settings import Settings
from broker.facade import Broker
from broker.redis.embedded import EmbeddedRedis
from channels.email.links import SECRET_ENV
from tests.support.backends import (  # noqa: F401 - fixtures the modules on both backends build on
    backend_param,
    on_backend_connect,
    on_backend_env,
    on_backend_make_broker,
    on_backend_rq,
)
from tests.support.ci_skips import pytest_runtest_makereport  # noqa: F401 - in CI a skip fails
from tests.support.cluster_harness import cluster_client, redis_cluster  # noqa: F401 - fixtures
from tests.support.collection_order import level_of
from tests.support.jobs import jobs_bound_to
from tests.support.notifier_setup import fake_receiver, fake_slack, fake_smtp  # noqa: F401 - the fakes

_db_numbers = itertools.cycle(range(1, 16))


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.close()


@pytest.fixture(scope="session", autouse=True)
def own_state_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The `up`s this session starts record themselves here (XDG_STATE_HOME), not in the
    user's state dir: a command of one test never finds a broker another test runs."""
    with pytest.MonkeyPatch.context() as patch:
        here = tmp_path_factory.mktemp("state")
        patch.setenv("XDG_STATE_HOME", str(here))
        yield here


@pytest.fixture(scope="session", autouse=True)
def link_secret() -> Iterator[str]:
    """Email links are signed with a secret from the environment, as a fleet's are (not Redis)."""
    with pytest.MonkeyPatch.context() as patch:
        value = secrets.token_hex(32)
        patch.setenv(SECRET_ENV, value)
        yield value


@pytest.fixture
def redis_url(redis_server: EmbeddedRedis) -> str:
    """A URL to a freshly flushed database of the session's Redis."""
    db = next(_db_numbers)
    url = redis_server.url_for(db)
    client = Redis.from_url(url)
    client.flushdb()
    client.close()
    return url


@pytest.fixture
def redis_unix_url(redis_server: EmbeddedRedis) -> str:
    """Like `redis_url`, over the session Redis's Unix socket (skipped if its path is too long)."""
    db = next(_db_numbers)
    url = redis_server.unix_url_for(db)
    if url is None:
        pytest.skip(f"{redis_server.data_dir} is too long a path for a Unix socket")
    client = Redis.from_url(url)
    client.flushdb()
    client.close()
    return url


@pytest.fixture
def redis(redis_url: str) -> Iterator[Redis]:
    client = Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def make_config() -> Callable[..., Config]:
    def make(raw: dict[str, Any] | None = None) -> Config:
        return parse_config(raw or {})

    return make


@pytest.fixture
def config() -> Config:
    """Two queues: `default` escalates to `managers`, which times out."""
    return parse_config(
        {
            "queues": {
                "default": {"channels": ["inbox"], "timeout_s": 600, "escalate_to": "managers"},
                "managers": {"channels": ["inbox"], "timeout_s": 1800},
            }
        }
    )


@pytest.fixture
def broker(redis: Redis, config: Config) -> Broker:
    return Broker(redis, config, prefix="t:")


@pytest.fixture
def tmp_config(tmp_path: Path) -> Callable[[str], Path]:
    def write(text: str) -> Path:
        path = tmp_path / "approval-broker.toml"
        path.write_text(text)
        return path

    return write


@pytest.fixture
def bound(broker: Broker) -> Iterator[Broker]:
    """The test's broker, with in-process RQ jobs bound to it."""
    with jobs_bound_to(broker):
        yield broker


DEFAULT_API_CONFIG: dict[str, Any] = {"queues": {"default": {"channels": ["inbox"]}}}


@pytest.fixture
def cfg(request: pytest.FixtureRequest) -> Config:
    """The config of an API test module's app: its `API_CONFIG` (a raw config), else one queue.

    A module that needs other fixtures to build its config overrides `cfg` with a fixture of its
    own, named after what differs.
    """
    raw = getattr(request.module, "API_CONFIG", DEFAULT_API_CONFIG)
    return parse_config(copy.deepcopy(raw))  # parsing resolves secrets in place: keep the module's


@pytest.fixture
def api_broker(redis: Redis, cfg: Config) -> Broker:
    """For API tests: a broker on the module's `cfg`."""
    return Broker(redis, cfg, prefix="t:")


@pytest.fixture
def api_settings() -> Settings:
    return Settings()


@pytest.fixture
def client(api_broker: Broker, cfg: Config, api_settings: Settings) -> Iterator[TestClient]:
    """The API app on `api_broker`, driven in-process."""
    from api.app import create_app

    with TestClient(create_app(api_settings, cfg, api_broker)) as c:
        yield c


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Order the run for pytest-xdist's workers (one module per unit of work, taken in order).

    The fleet test (minutes, 14 processes) goes first so it is not the tail; the other system
    modules (processes, browsers, clusters) are spread among the integration modules, so that
    at most about one worker at a time starts a fleet of processes; the short unit tests go last
    and even out the workers' ends.
    """
    modules: dict[Path, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.path, []).append(item)
    fleets = [m for m, its in modules.items() if any(i.get_closest_marker("fleet") for i in its)]
    first = sorted(fleets, key=lambda m: m.name != "test_fleet.py")[:1]  # the longest of them
    levels = {m: level_of(m, its) for m, its in modules.items()}
    system = [m for m in modules if levels[m] == "system" and m not in first]
    unit = [m for m in modules if levels[m] == "unit"]
    rest = [m for m in modules if m not in first and m not in system and m not in unit]
    spread: list[Path] = []
    step = max(1, len(rest) // max(1, len(system)))
    for n, module in enumerate(rest):
        if n % step == 0 and system:
            spread.append(system.pop(0))
        spread.append(module)
    items[:] = [i for m in [*first, *spread, *system, *unit] for i in modules[m]]
