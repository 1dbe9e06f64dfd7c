"""LangGraph's side of bench_agents: the same cycle as a graph that pauses with `interrupt()`.

A graph `model -> approval (interrupt) -> answer`, resumed with `Command(resume=...)`, on a
checkpointer: `AsyncPostgresSaver` (on bench/throwaway_postgres.py's server) or
`AsyncSqliteSaver` (a temp file). The approval node is the tool: it counts its runs per thread.
With `slow_s`, each of the two model nodes sleeps that long asynchronously, as a provider's call.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, TypedDict


class GraphState(TypedDict, total=False):
    prompt: str
    approved: bool
    output: str


class LangGraphSide:
    """A model -> approval (interrupt) -> model graph on a checkpointer; the tool counts runs."""

    def __init__(self, checkpointer: Any, slow_s: float = 0.0) -> None:
        from langgraph.config import get_config
        from langgraph.graph import END, START, StateGraph
        from langgraph.types import interrupt

        self.ran: dict[str, int] = {}
        self.slow_s = slow_s
        ran = self.ran

        async def model(state: GraphState) -> GraphState:
            if self.slow_s:
                await asyncio.sleep(self.slow_s)
            return {}

        async def approval(state: GraphState) -> GraphState:
            decision = interrupt({"tool": "refund", "args": {"order": "A1", "amount": 5}})
            if decision.get("outcome") == "approved":  # the tool
                tid = get_config()["configurable"]["thread_id"]
                ran[tid] = ran.get(tid, 0) + 1
            return {"approved": True}

        async def answer(state: GraphState) -> GraphState:
            if self.slow_s:
                await asyncio.sleep(self.slow_s)
            return {"output": "refunded"}

        g = StateGraph(GraphState)
        g.add_node("model", model)
        g.add_node("approval", approval)
        g.add_node("answer", answer)
        g.add_edge(START, "model")
        g.add_edge("model", "approval")
        g.add_edge("approval", "answer")
        g.add_edge("answer", END)
        self.graph = g.compile(checkpointer=checkpointer)
        self.in_flight = 0
        self.peak = 0

    async def cycle(self, agent: str) -> float:
        from langgraph.types import Command

        tid = secrets.token_hex(8)
        config = {"configurable": {"thread_id": tid}}
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            out = await self.graph.ainvoke({"prompt": "Refund A1."}, config)
            assert "__interrupt__" in out, out
            began = time.perf_counter()
            done = await self.graph.ainvoke(Command(resume={"outcome": "approved"}), config)
            assert done.get("output") == "refunded", done
            return time.perf_counter() - began
        finally:
            self.in_flight -= 1

    async def race(self) -> dict[str, Any]:
        from langgraph.types import Command

        tid = secrets.token_hex(8)
        config = {"configurable": {"thread_id": tid}}
        await self.graph.ainvoke({"prompt": "Refund A1."}, config)

        async def approve() -> str:
            try:
                await self.graph.ainvoke(Command(resume={"outcome": "approved"}), config)
                return "ok"
            except Exception as exc:  # noqa: BLE001 - reported, not hidden
                return type(exc).__name__

        results = await asyncio.gather(approve(), approve())
        return {"tool_ran": self.ran.get(tid, 0), "results": sorted(results)}


@contextlib.asynccontextmanager
async def pg_saver(uri: str) -> AsyncIterator[Any]:
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool

    kwargs = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
    async with AsyncConnectionPool(uri, min_size=4, max_size=50, kwargs=kwargs, open=False) as pool:
        saver = AsyncPostgresSaver(pool)  # type: ignore[arg-type]
        await saver.setup()
        yield saver


@contextlib.asynccontextmanager
async def sqlite_saver(path: Path) -> AsyncIterator[Any]:
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    async with AsyncSqliteSaver.from_conn_string(str(path)) as saver:
        yield saver
