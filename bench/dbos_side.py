"""DBOS + pydantic-ai: bench_agents' cycle on pydantic-ai's own DBOS durability capability.

The agents are fake_agents' (the same FunctionModel answers, the same `refund` tool that needs
approval) with `DBOSDurability()` attached, so each model request runs as a DBOS step. One run is
one DBOS workflow (`refund_run`), on a PostgreSQL system database (fsync on, the one
bench_agents starts), as the pydantic-ai and DBOS docs put human approval together:

1. `agent.run(...)` ends with `DeferredToolRequests` (model request 1 is a step);
2. the workflow publishes the pending tool call ids (`DBOS.set_event`, key `pending`) and waits
   durably for a decision (`DBOS.recv`, topic `decision`): the paused run is this waiting
   workflow; after a crash DBOS replays it from its recorded steps and waits again;
3. the decider, another task, reads `pending` (`DBOS.get_event`) and sends the decision
   (`DBOS.send` to the workflow id): LISTEN/NOTIFY wakes the waiting `recv`;
4. a second `agent.run(message_history=..., deferred_tool_results=...)` runs the tool (its side
   effect is a DBOS step, so a replay does not repeat it) and model request 2 (a step); the
   workflow's result is the run's output.

DBOS keeps its own state in its `dbos` schema (workflow status, step outputs, events,
notifications), through SQLAlchemy on a pool of 20 connections, each DB call in a thread.
DBOS has no second-approver guard: two deciders both `send`, both calls succeed, and the
workflow's one `recv` takes the first message (the other stays unread): the tool runs once, and
neither decider learns which decision counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from dbos import DBOS, DBOSConfig
from fake_agents import answer_now, answer_slowly
from pydantic_ai import (
    Agent,
    ApprovalRequired,
    DeferredToolRequests,
    DeferredToolResults,
    RunContext,
)
from pydantic_ai.durable_exec.dbos import DBOSDurability
from pydantic_ai.models.function import FunctionModel
from sqlalchemy import make_url

PENDING = "pending"
"""The workflow event that holds the paused run's tool call ids (what a decider reads)."""
DECISION = "decision"
"""The topic a decision is sent on."""
WAIT_S = 60.0
"""How long a workflow waits for a decision, and a decider for a run to pause."""

RAN: dict[str, int] = {}
"""How many times `refund` ran, per run (the `record_refund` step counts here)."""


@dataclass
class Refunds:
    key: str


@DBOS.step()
async def record_refund(key: str) -> None:
    """The tool's side effect, as a step: recorded once done, not repeated by a replay."""
    RAN[key] = RAN.get(key, 0) + 1


def _agent(name: str, model: FunctionModel) -> Agent[Refunds, str | DeferredToolRequests]:
    agent: Agent[Refunds, str | DeferredToolRequests] = Agent(
        model,
        name=name,
        deps_type=Refunds,
        output_type=[str, DeferredToolRequests],
        capabilities=[DBOSDurability()],
    )

    @agent.tool
    async def refund(ctx: RunContext[Refunds], order: str, amount: int) -> str:
        """Refund an order: needs a person's approval."""
        if not ctx.tool_call_approved:
            raise ApprovalRequired()
        await record_refund(ctx.deps.key)
        return f"refunded {amount} on {order}"

    return agent


# DBOS registers workflows and steps before launch: the agents exist at import.
AGENTS = {
    "fast": _agent("bench_fast", FunctionModel(answer_now)),
    "slow": _agent("bench_slow", FunctionModel(answer_slowly)),
}


@DBOS.workflow()
async def refund_run(agent: str, key: str) -> str:
    """One whole run: pause on the approval, wait for the decision, resume, finish."""
    deps = Refunds(key)
    paused = await AGENTS[agent].run("Refund A1.", deps=deps)
    requests = paused.output
    assert isinstance(requests, DeferredToolRequests), requests
    await DBOS.set_event_async(PENDING, [call.tool_call_id for call in requests.approvals])
    decision = await DBOS.recv_async(DECISION, timeout_seconds=WAIT_S)
    if decision is None:
        return "no decision"
    results = DeferredToolResults(
        approvals={call.tool_call_id: decision == "approved" for call in requests.approvals}
    )
    done = await AGENTS[agent].run(
        message_history=paused.all_messages(), deferred_tool_results=results, deps=deps
    )
    return str(done.output)


@contextlib.asynccontextmanager
async def launched(postgres_uri: str) -> AsyncIterator[None]:
    """DBOS launched on a system database of its own (`dbos_bench`, created by DBOS) on the
    PostgreSQL at `postgres_uri`; destroyed on exit."""
    url = make_url(postgres_uri).set(database="dbos_bench")
    config: DBOSConfig = {
        "name": "bench_agents",
        "system_database_url": url.render_as_string(hide_password=False),
        "log_level": "WARNING",
    }
    DBOS(config=config)
    await asyncio.to_thread(DBOS.launch)
    try:
        yield
    finally:
        await asyncio.to_thread(DBOS.destroy)


class DBOSSide:
    """bench_agents' side API (`cycle`, `race`, `in_flight`, `peak`) for DBOS + pydantic-ai."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.peak = 0

    async def _paused(self, agent: str) -> tuple[str, Any]:
        """A new run, once it waits for its decision: (its key, its workflow handle)."""
        key = secrets.token_hex(8)
        handle = await DBOS.start_workflow_async(refund_run, agent, key)
        pending = await DBOS.get_event_async(handle.workflow_id, PENDING, timeout_seconds=WAIT_S)
        assert pending, f"workflow {handle.workflow_id} did not pause"
        return key, handle

    async def cycle(self, agent: str) -> float:
        """One whole cycle; returns decision -> finished, in seconds."""
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            _, handle = await self._paused(agent)
            began = time.perf_counter()
            await DBOS.send_async(handle.workflow_id, "approved", DECISION)
            assert await handle.get_result() == "refunded"
            return time.perf_counter() - began
        finally:
            self.in_flight -= 1

    async def race(self) -> dict[str, Any]:
        """Two deciders send an approval to one paused run at once."""
        key, handle = await self._paused("fast")

        async def approve() -> str:
            try:
                await DBOS.send_async(handle.workflow_id, "approved", DECISION)
                return "sent"
            except Exception as exc:  # noqa: BLE001 - reported, not hidden
                return type(exc).__name__

        results = await asyncio.gather(approve(), approve())
        output = await handle.get_result()
        return {"tool_ran": RAN.get(key, 0), "results": sorted(results), "output": output}
