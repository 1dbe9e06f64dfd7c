"""Turning a registered agent's spec into the objects a worker runs: the Agent and its deps."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from broker.domain.config_sections import AgentConfig
from broker.facade import Broker
from broker.runs.agents import (
    IN_PROCESS,
    LOCAL_AGENTS,
    CannotPause,
    DepsContext,
    DepsFactory,
    LocalAgents,
    agent_spec,
    pausable_output_type,
)


class AgentLoadError(Exception):
    """The agent (or its deps factory) can't be loaded here; the run fails with this message."""


def import_object(path: str, what: str) -> Any:
    """Import 'package.module:attr.sub' and return the attribute."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise AgentLoadError(f"{what} {path!r} is not of the form 'package.module:name'")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise AgentLoadError(f"{what} {path!r}: cannot import {module_name!r} ({exc})") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise AgentLoadError(f"{what} {path!r}: {module_name!r} has no {attr!r}") from None
    return obj


@dataclass
class LoadedAgent:
    """A registered agent ready to run: its spec, the Agent object and how to make its deps."""

    name: str
    spec: AgentConfig
    agent: Any
    deps_factory: DepsFactory | None
    output_type: list[Any] | None = None
    """What a run passes as `output_type` so the agent can pause (None: it declares that itself)."""

    def deps(self, broker: Broker, run_id: str, data: Any) -> Any:
        """The run's deps: the factory's result, or the JSON given to `start_run` as is."""
        if self.deps_factory is None:
            return data
        return self.deps_factory(DepsContext(broker, run_id, self.name, data))


def load_agent(broker: Broker, name: str, local: LocalAgents | None = None) -> LoadedAgent:
    """Find a registered agent by name: an in-process object first, else its import path."""
    spec = agent_spec(broker, name)
    here = (local or LOCAL_AGENTS).get(broker.keys.prefix, name)
    if here is not None and here.agent is not None:
        agent = here.agent
    elif spec.path == IN_PROCESS:
        raise AgentLoadError(
            f"agent {name!r} was registered as an object in another process; register it with "
            "an import path ('package.module:agent') so that every worker can load it"
        )
    else:
        agent = import_object(spec.path, f"agent {name!r}")
    if not hasattr(agent, "iter"):
        raise AgentLoadError(f"agent {name!r} ({spec.path}) is not a pydantic-ai Agent")
    try:
        output_type = pausable_output_type(agent, name)
    except CannotPause as exc:
        raise AgentLoadError(str(exc)) from None
    factory: DepsFactory | None = here.deps if here is not None else None
    if factory is None and spec.deps:
        factory = import_object(spec.deps, f"deps factory of agent {name!r}")
        if not callable(factory):
            raise AgentLoadError(f"deps factory {spec.deps!r} of agent {name!r} is not callable")
    return LoadedAgent(name, spec, agent, factory, output_type)
