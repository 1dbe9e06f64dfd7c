"""The agent registry: config agents, run-time registration, and clear errors for bad input."""

from __future__ import annotations

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import ModelResponse, TextPart
from pydantic_ai.models.function import FunctionModel
from redis import Redis

from broker.domain.config import Config, parse_config
from broker.domain.errors import InvalidInput, NotFound
from broker.domain.models import RunStatus
from broker.facade import Broker
from broker.runs.agent_loader import AgentLoadError, load_agent
from broker.runs.agents import LocalAgents, agent_spec, register_agent, unregister_agent
from broker.runs.starting import known_agents, run_job_id, run_queue, start_run
from workers.worker import preload


def test_registered_agent_is_known_fleet_wide_with_its_spec(broker: Broker) -> None:
    spec = register_agent(
        broker,
        "refunds",
        "refunds_demo:agent",
        deps="refunds_demo:make_deps",
        tool_queues={"issue_refund": "managers"},
        max_rounds=4,
    )
    assert "refunds" in known_agents(broker)
    assert agent_spec(broker, "refunds") == spec
    assert (spec.queue, spec.tool_queues, spec.max_rounds) == ("default", {"issue_refund": "managers"}, 4)  # fmt: skip
    # another process (a fresh Broker on the same Redis) loads the same agent
    other = Broker(Redis(connection_pool=broker.redis.connection_pool), broker.config, prefix="t:")
    loaded = load_agent(other, "refunds")
    from refunds_demo import agent, make_deps

    assert loaded.agent is agent and loaded.deps_factory is make_deps
    unregister_agent(broker, "refunds")
    assert "refunds" not in known_agents(broker)


def test_default_max_rounds_is_the_fleets(redis: Redis) -> None:
    config = parse_config({"broker": {"max_rounds": 7}})
    broker = Broker(redis, config, prefix="t:")
    assert register_agent(broker, "a", "refunds_demo:agent").max_rounds == 7


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"agent": "refunds_demo"}, "is not an import path"),
        ({"agent": "refunds_demo:agent", "deps": "nope"}, "is not an import path"),
        ({"agent": "refunds_demo:agent", "queue": "nowhere"}, "queue 'nowhere' is not defined"),
        ({"agent": "refunds_demo:agent", "tool_queues": {"t": "x"}}, "queue 'x' is not defined"),
        ({"agent": "refunds_demo:agent", "name": "bad name!"}, "may hold only letters"),
        (
            {"agent": "refunds_demo:agent", "deps": 42},
            "deps must be an import path or a callable",
        ),  # fmt: skip
    ],
)
def test_bad_registrations_are_refused_clearly(
    broker: Broker, kwargs: dict[str, object], message: str
) -> None:
    name = str(kwargs.pop("name", "x"))
    with pytest.raises(InvalidInput, match=message):
        register_agent(broker, name, **kwargs)  # type: ignore[arg-type]
    assert broker.redis.exists(broker.keys.agent(name), broker.keys.agents) == 0


def test_config_agents_win_and_cannot_be_shadowed(redis: Redis) -> None:
    config = parse_config(
        {"agents": {"refunds": {"path": "refunds_demo:agent", "deps": "refunds_demo:make_deps"}}}
    )
    broker = Broker(redis, config, prefix="t:")
    assert "refunds" in known_agents(broker)
    assert agent_spec(broker, "refunds").path == "refunds_demo:agent"
    with pytest.raises(InvalidInput, match="defined in the config"):
        register_agent(broker, "refunds", "tests.support.agents:ask_agent")


def test_starting_an_unknown_agent_or_bad_deps_is_refused_before_anything_is_stored(
    broker: Broker,
) -> None:
    with pytest.raises(NotFound, match="no agent named 'ghost'"):
        start_run(broker, "ghost", "hi")
    register_agent(broker, "refunds", "refunds_demo:agent")
    with pytest.raises(InvalidInput, match="deps must be JSON-serializable"):
        start_run(broker, "refunds", "hi", deps={"when": object()})
    assert list(broker.redis.scan_iter(broker.keys.prefix + "run:*")) == []
    assert run_queue(broker).count == 0


def test_start_run_stores_a_queued_run_and_one_job(broker: Broker) -> None:
    register_agent(broker, "refunds", "refunds_demo:agent")
    run = start_run(broker, "refunds", "hi", deps={"limit": 5})
    assert run.status is RunStatus.queued and run.round == 0
    job = run_queue(broker).fetch_job(run_job_id(run.id))
    assert (
        job is not None
        and job.func_name == "broker.runs.agent_jobs.run_agent"
        and job.args == [run.id]
    )
    assert job.retries_left == 3 and job.retry_intervals == [2, 10, 60]
    assert broker.run_fields(run.id)["deps"] == '{"limit": 5}'


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("no_such_module_xyz:agent", "cannot import 'no_such_module_xyz'"),
        ("refunds_demo:nothing_here", "has no 'nothing_here'"),
        ("refunds_demo:ORDERS", "is not a pydantic-ai Agent"),
    ],
)
def test_agents_that_cannot_be_loaded_say_why(
    broker: Broker, config: Config, path: str, message: str
) -> None:
    register_agent(broker, "x", path)
    with pytest.raises(AgentLoadError, match=message):
        load_agent(broker, "x")
    assert any(message in p for p in preload(broker))  # the worker warns at start


def test_registering_again_replaces_the_in_process_agent(broker: Broker) -> None:
    from refunds_demo import agent as demo_agent

    local = LocalAgents()
    inline = Agent(FunctionModel(lambda messages, info: ModelResponse(parts=[TextPart("hi")])))
    register_agent(broker, "x", inline, deps=lambda ctx: "inline deps", local=local)
    assert load_agent(broker, "x", local).agent is inline

    register_agent(broker, "x", "refunds_demo:agent", deps="refunds_demo:make_deps", local=local)
    loaded = load_agent(broker, "x", local)
    assert loaded.agent is demo_agent  # not the object registered before
    from refunds_demo import make_deps

    assert loaded.deps_factory is make_deps

    register_agent(broker, "x", inline, local=local)
    unregister_agent(broker, "x", local=local)
    assert local.get(broker.keys.prefix, "x") is None
    with pytest.raises(NotFound):
        load_agent(broker, "x", local)


def test_an_agent_that_cannot_pause_is_refused_before_any_run(broker: Broker, redis: Redis) -> None:
    from tests.support.agents import validated_agent

    with pytest.raises(InvalidInput, match="has output validators but its output_type") as err:
        register_agent(broker, "v", validated_agent, local=LocalAgents())
    assert err.value.code == "agent_cannot_pause"
    assert "v" not in known_agents(broker)

    config = parse_config({"agents": {"v": {"path": "tests.support.agents:validated_agent"}}})
    from_config = Broker(redis, config, prefix="t:")
    [problem] = preload(from_config)  # the worker says so when it starts
    assert "DeferredToolRequests" in problem and "'v'" in problem
    with pytest.raises(AgentLoadError, match="can't pause for a decision"):
        load_agent(from_config, "v")


def test_a_run_and_its_first_job_are_stored_together_or_not_at_all(broker: Broker) -> None:
    """Redis fails at EXEC: neither a run stuck in `queued` nor a job without its run is left."""
    from unittest import mock

    from redis.client import Pipeline
    from redis.exceptions import ConnectionError as RedisConnectionError

    register_agent(broker, "refunds", "refunds_demo:agent")
    with (
        mock.patch.object(Pipeline, "execute", side_effect=RedisConnectionError("gone")),
        pytest.raises(RedisConnectionError),
    ):
        start_run(broker, "refunds", "hi")
    assert list(broker.redis.scan_iter(broker.keys.prefix + "run:*")) == []
    assert run_queue(broker).count == 0
    run = start_run(broker, "refunds", "hi")
    assert run.status.value == "queued" and run_queue(broker).job_ids == [f"run-{run.id}-0"]
