"""The agent registry: which pydantic-ai agents the fleet can run, by name.

An agent comes from the config (`[agents.NAME]`) or from `register_agent(...)` at run time.
A run-time spec is stored in Redis so every worker of the fleet sees it; an agent given as an
object instead of an import path is also kept in this process, for in-process workers and
`broker.testing`. Nothing here imports RQ worker code, so the API and `up` can register agents.
"""

from __future__ import annotations

import re
from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from broker.domain.config_sections import AgentConfig
from broker.domain.errors import InvalidInput, NotFound
from broker.facade import Broker

IN_PROCESS = "<in-process>"
"""The `path` stored for an agent registered as an object: only this process can run it."""

_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


@dataclass(frozen=True)
class DepsContext:
    """What a deps factory is called with, to build the deps of one run (or one resume of it)."""

    broker: Broker
    run_id: str
    agent: str
    data: Any = None
    """The JSON value given to `start_run(..., deps=...)`."""


DepsFactory = Callable[[DepsContext], Any]


@dataclass
class LocalAgent:
    """An agent object (and deps factory) registered in this process."""

    agent: Any
    deps: DepsFactory | None = None


@dataclass
class LocalAgents:
    """In-process agent objects by (key prefix, name): one table per process by default."""

    table: MutableMapping[tuple[str, str], LocalAgent] = field(default_factory=dict)

    def put(self, prefix: str, name: str, local: LocalAgent) -> None:
        self.table[(prefix, name)] = local

    def get(self, prefix: str, name: str) -> LocalAgent | None:
        return self.table.get((prefix, name))

    def delete(self, prefix: str, name: str) -> None:
        self.table.pop((prefix, name), None)


LOCAL_AGENTS = LocalAgents()


def check_import_path(path: str, what: str) -> None:
    if not _IMPORT_PATH.match(path):
        raise InvalidInput(
            f"{what} {path!r} is not an import path of the form 'package.module:name'",
            code="bad_import_path",
        )


class CannotPause(ValueError):
    """The agent can never pause on a deferred call in a run the broker starts."""


def declared_output_types(agent: Any) -> list[Any]:
    declared = getattr(agent, "output_type", None)
    if isinstance(declared, Sequence) and not isinstance(declared, str):
        return list(declared)
    return [declared]


def pausable_output_type(agent: Any, name: str) -> list[Any] | None:
    """The `output_type` a run must pass so the agent can end in `DeferredToolRequests`.

    None when the agent declares `DeferredToolRequests` itself. pydantic-ai refuses a run-time
    `output_type` for an agent with output validators (they expect the declared type), so such an
    agent must declare it: checked here, once per registration or load, so the problem shows up
    before a run starts instead of at its first deferred call, after tools may have run. The
    validators are only visible through pydantic-ai's private `_output_validators`; this is the one
    place that reads it. pydantic-ai is imported here, by the time an agent object exists, so
    that the API (which names agents but never runs one) starts without loading it.
    """
    from pydantic_ai import DeferredToolRequests

    declared = declared_output_types(agent)
    if DeferredToolRequests in declared:
        return None
    if getattr(agent, "_output_validators", None):
        raise CannotPause(
            f"agent {name!r} has output validators but its output_type does not include "
            "DeferredToolRequests, so its runs can't pause for a decision; declare "
            "output_type=[YourOutput, DeferredToolRequests] (and let the validators pass "
            "DeferredToolRequests through)"
        )
    return [*declared, DeferredToolRequests]


def register_agent(
    broker: Broker,
    name: str,
    agent: str | Any,
    *,
    deps: str | DepsFactory | None = None,
    queue: str = "default",
    tool_queues: dict[str, str] | None = None,
    max_rounds: int | None = None,
    local: LocalAgents | None = None,
) -> AgentConfig:
    """Register an agent under `name` for the whole fleet; returns the stored spec.

    `agent` is an import path ("pkg.mod:agent") that any worker can import, or an Agent object
    (then only workers in this process can run it). `deps` is likewise an import path of a
    factory, or a callable; it is called with a `DepsContext`. Requests of the agent go to
    handler queue `queue`, or to `tool_queues[tool_name]`. A run that asks for decisions in more
    than `max_rounds` rounds fails (default: `[broker] max_rounds`).
    """
    if not name or not re.fullmatch(r"[\w.-]{1,100}", name):
        raise InvalidInput(f"agent name {name!r} may hold only letters, digits, '_', '-' and '.'")
    if name in broker.config.agents:
        raise InvalidInput(
            f"agent {name!r} is defined in the config; change it there", code="agent_in_config"
        )
    in_process = not isinstance(agent, str)
    if isinstance(agent, str):
        check_import_path(agent, "agent")
    else:
        try:
            pausable_output_type(agent, name)
        except CannotPause as exc:
            raise InvalidInput(str(exc), code="agent_cannot_pause") from None
    if isinstance(deps, str):
        check_import_path(deps, "deps factory")
    elif deps is not None and not callable(deps):
        raise InvalidInput("deps must be an import path or a callable taking a DepsContext")
    for queue_name in [queue, *(tool_queues or {}).values()]:
        if queue_name not in broker.config.queues:
            known = ", ".join(sorted(broker.config.queues))
            raise InvalidInput(
                f"queue {queue_name!r} is not defined (known: {known})", code="unknown_queue"
            )
    try:
        spec = AgentConfig(
            path=IN_PROCESS if in_process else agent,
            deps=deps if isinstance(deps, str) else None,
            queue=queue,
            tool_queues=tool_queues or {},
            max_rounds=max_rounds or broker.config.broker.max_rounds,
        )
    except ValidationError as exc:
        raise InvalidInput(str(exc.errors()[0]["msg"])) from None
    table = local or LOCAL_AGENTS
    if in_process or callable(deps):
        table.put(
            broker.keys.prefix,
            name,
            LocalAgent(agent=agent if in_process else None, deps=deps if callable(deps) else None),
        )
    else:  # an earlier registration's object or factory must not outlive it in this process
        table.delete(broker.keys.prefix, name)
    pipe = broker.redis.pipeline()
    pipe.set(broker.keys.agent(name), spec.model_dump_json())
    pipe.sadd(broker.keys.agents, name)
    pipe.execute()
    return spec


def unregister_agent(broker: Broker, name: str, *, local: LocalAgents | None = None) -> None:
    """Forget a run-time registered agent (runs already started keep failing clearly).

    Other processes drop their in-process copy only when they register the name again.
    """
    (local or LOCAL_AGENTS).delete(broker.keys.prefix, name)
    pipe = broker.redis.pipeline()
    pipe.delete(broker.keys.agent(name))
    pipe.srem(broker.keys.agents, name)
    pipe.execute()


def agent_spec(broker: Broker, name: str) -> AgentConfig:
    """The spec of a registered agent: the config's `[agents.NAME]` first, then Redis."""
    if name in broker.config.agents:
        return broker.config.agents[name]
    raw = broker.redis.get(broker.keys.agent(name))
    if raw is None:
        raise NotFound(f"no agent named {name!r} is registered", code="unknown_agent")
    return AgentConfig.model_validate_json(raw)
