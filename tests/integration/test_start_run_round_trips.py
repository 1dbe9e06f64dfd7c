"""Starting a run costs one round trip for an agent the config names: the run and its first job
in one MULTI, and the run handed back as written (`queued`), not read again. A registered agent
(one the config doesn't have) costs one SISMEMBER more; an unknown one is refused with the
agents it could have been. Before, every start read the whole set of registered agents and read
the run back: three round trips. The module has a Redis of its own: Redis counts round trips
server-wide."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from redis import Redis

from broker.domain.config import parse_config
from broker.domain.errors import NotFound
from broker.domain.models import Run, RunStatus
from broker.facade import Broker
from broker.runs.agents import register_agent
from broker.runs.starting import run_job_id, run_queue, start_run
from tests.support.counted_redis import (
    redis_server,  # noqa: F401 - counts need a Redis of their own
    round_trips,
)

CONFIG = {
    "queues": {"default": {"channels": ["inbox"]}},
    "agents": {"configured": {"path": "tests.support.agents:effects_agent"}},
}


@pytest.fixture
def starter(redis: Redis) -> Broker:
    return Broker(redis, parse_config(CONFIG), prefix="t:")


def _round_trips(redis_url: str, action: Callable[[], Run]) -> tuple[int, Run]:
    counter = Redis.from_url(redis_url)
    before = round_trips(counter)
    run = action()
    trips = round_trips(counter) - before - 1  # less this INFO
    counter.close()
    return trips, run


def test_starting_a_run_of_a_configured_agent_takes_one_round_trip(
    starter: Broker, redis_url: str
) -> None:
    start_run(starter, "configured", "warm up")  # the client's connection, made once
    trips, run = _round_trips(redis_url, lambda: start_run(starter, "configured", "Pay."))
    assert trips == 1
    assert run.status is RunStatus.queued and run.agent == "configured"
    assert starter.get_run(run.id) == run  # what it handed back is what it wrote
    assert run_queue(starter).fetch_job(run_job_id(run.id)) is not None


def test_starting_a_run_of_a_registered_agent_asks_redis_once_more(
    starter: Broker, redis_url: str
) -> None:
    register_agent(starter, "registered", "tests.support.agents:effects_agent")
    start_run(starter, "configured", "warm up")
    trips, run = _round_trips(redis_url, lambda: start_run(starter, "registered", "Pay."))
    assert trips == 2
    assert starter.get_run(run.id).agent == "registered"


def test_starting_an_unknown_agent_names_the_known_ones(starter: Broker) -> None:
    register_agent(starter, "registered", "tests.support.agents:effects_agent")
    with pytest.raises(NotFound, match=r"no agent named 'nope'.*known: configured, registered"):
        start_run(starter, "nope", "Pay.")
