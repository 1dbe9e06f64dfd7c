"""The whole approval cycle of an agent run, beside pydantic-ai alone, DBOS and LangGraph.

    uv run --group bench python bench/bench_agents.py [--runs 200] [--latency 50] [--json]
        [--broker-only] [--fsync always|everysec]

One cycle: a run starts, its (fake, instant) model calls a tool that needs approval, the run
pauses durably, a decision arrives, the run resumes, the tool runs once, the run finishes.

* approval-broker: `approval-broker up` (embedded Redis, API, a worker process per core (at
  most 4) unless `--up-workers N`, notifier, sweeper) as the user runs it; runs started
  over `POST /v1/runs`, decided over `POST /v1/requests/{id}/decision`, followed with
  long-polls `GET /v1/runs/{id}?wait=30` (bench/fake_agents.py).
* pydantic-ai alone: the same agents in this process with no broker and no durability (the
  history through JSON, a second run with `DeferredToolResults`): the floor under the broker's
  figures, what pydantic-ai's own agent loop costs on one core.
* DBOS + pydantic-ai: the same agents with pydantic-ai's `DBOSDurability` capability, one DBOS
  workflow per run that pauses on `DBOS.recv` and is decided with `DBOS.send`, in this process
  (bench/dbos_side.py).
* LangGraph: a graph `model -> approval (interrupt) -> model`, resumed with `Command(resume=...)`,
  on `AsyncPostgresSaver` and on `AsyncSqliteSaver` (a temp file), in this process
  (bench/langgraph_side.py).

DBOS and LangGraph's PostgresSaver run on a PostgreSQL this script starts (Debian's postgresql,
a temp dir, a free loopback port, fsync on: bench/throwaway_postgres.py).

Each side is warmed up with a burst as large as the one it is measured on (`--runs`): the first
burst of 200 grows every connection pool to that size (the API's asyncio client opened about 190
Redis connections in it, a millisecond of the API's CPU per cycle), which a running fleet did
long before; the other sides' pools likewise.

Printed: runs/s with `--runs` started at once (each approved as soon as it waits); decision ->
run finished one at a time, p50/p99; the double-approve race (two deciders approve one paused
run at once: how often the tool ran, the HTTP codes); CPU per cycle in the throughput phase (each
process of `up`; this process and the PostgreSQL server for the others) and what one cycle
writes to its store (Redis commands and AOF bytes; PostgreSQL write transactions and WAL bytes);
and a slow-model phase (each model call sleeps `--slow-s` asynchronously, two calls per run):
runs/s and, for the broker, the worker's memory per run in flight (RSS growth / runs in flight
at the peak).

Other processes on the machine share its cores: figures are as measured, in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from benchlib import pct  # noqa: E402
from broker_side import IDLE_S, BrokerSide, Up, slow_broker  # noqa: E402
from langgraph_side import LangGraphSide, pg_saver, sqlite_saver  # noqa: E402
from throwaway_postgres import Postgres, postgres  # noqa: E402

PHASE_TIMEOUT_S = 300.0
"""A phase that takes longer is reported as it stands, not waited for."""

BROKER = "approval-broker"
ALONE = "pydantic-ai alone, no durability"
WITH_DBOS = "DBOS + pydantic-ai"
LG_POSTGRES = "LangGraph + PostgresSaver"
LG_SQLITE = "LangGraph + SqliteSaver"
SIDES = (BROKER, ALONE, WITH_DBOS, LG_POSTGRES, LG_SQLITE)
"""The sides, in the table's order."""


# ---- pydantic-ai alone ----------------------------------------------------------------------------


class _NoRedis:
    """The fake agents' tool counts in Redis; here it counts in memory (`PydanticAISide.ran`)."""

    def __init__(self, ran: dict[str, int]) -> None:
        self.ran = ran

    def incr(self, key: str) -> None:
        self.ran[key] = self.ran.get(key, 0) + 1


class PydanticAISide:
    """The same agents and cycle in this process, with no broker and no durability: the run
    ends with `DeferredToolRequests`, its history goes through JSON (as a store would keep
    it), and a second run resumes it with `DeferredToolResults`. The floor under the broker's
    cycle: what pydantic-ai itself costs, on one core."""

    def __init__(self) -> None:
        import fake_agents

        self.agents = {"fast": fake_agents.fast, "slow": fake_agents.slow}
        self.ran: dict[str, int] = {}
        self.in_flight = 0
        self.peak = 0

    async def _pause(self, agent: str, key: str) -> tuple[Any, Any]:
        from fake_agents import Counter
        from pydantic_ai import DeferredToolRequests
        from pydantic_ai.messages import ModelMessagesTypeAdapter

        deps = Counter(_NoRedis(self.ran), key)  # type: ignore[arg-type]
        paused = await self.agents[agent].run("Refund A1.", deps=deps)
        assert isinstance(paused.output, DeferredToolRequests), paused.output
        stored = ModelMessagesTypeAdapter.dump_json(paused.all_messages())
        return deps, (stored, paused.output)

    async def _resume(self, agent: str, deps: Any, paused: Any) -> str:
        from pydantic_ai import DeferredToolResults
        from pydantic_ai.messages import ModelMessagesTypeAdapter

        stored, requests = paused
        results = DeferredToolResults(approvals={c.tool_call_id: True for c in requests.approvals})
        done = await self.agents[agent].run(
            message_history=ModelMessagesTypeAdapter.validate_json(stored),
            deferred_tool_results=results,
            deps=deps,
        )
        return str(done.output)

    async def cycle(self, agent: str) -> float:
        key = secrets.token_hex(8)
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            deps, paused = await self._pause(agent, key)
            began = time.perf_counter()
            assert await self._resume(agent, deps, paused) == "refunded"
            return time.perf_counter() - began
        finally:
            self.in_flight -= 1

    async def race(self) -> dict[str, Any]:
        key = secrets.token_hex(8)
        deps, paused = await self._pause("fast", key)
        results = await asyncio.gather(*(self._resume("fast", deps, paused) for _ in range(2)))
        return {"tool_ran": self.ran.get(key, 0), "results": ["ok" if r else r for r in results]}


# ---- the phases -----------------------------------------------------------------------------------


async def throughput(side: Any, agent: str, n: int) -> float:
    began = time.perf_counter()
    await asyncio.gather(*(side.cycle(agent) for _ in range(n)))
    return n / (time.perf_counter() - began)


async def latency(side: Any, n: int) -> tuple[float, float]:
    took = [await side.cycle("fast") for _ in range(n)]
    return pct(took, 0.50) * 1000, pct(took, 0.99) * 1000


async def measure(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    up = Up(tmp / "up", args.broker_code, args.up_workers, args.fsync)
    # every run in flight holds a connection with its long-poll, and starts or decides on another
    connections = 2 * max(args.runs, args.slow_runs) + 16
    headers = {"Authorization": f"Bearer {up.token}"}
    try:
        # aiohttp, the lightest client at hand (as bench_api's): httpx's pool spends most of a
        # core on its bookkeeping with a thousand connections, and the bench measured itself
        async with aiohttp.ClientSession(
            base_url=up.base,
            headers=headers,
            # idle connections are dropped before the API's keep-alive timeout closes them: a
            # request sent on one the server is closing at that moment is lost (Server
            # disconnected); aiohttp keeps them 15 s by default, the API 5 s
            connector=aiohttp.TCPConnector(limit=connections, keepalive_timeout=IDLE_S),
            timeout=aiohttp.ClientTimeout(total=60),
        ) as client:
            await up.ready(client)
            side = BrokerSide(up, client)
            await throughput(side, "fast", args.runs)  # warm up (the module's docstring)
            cpu = up.cpu_by_role()
            store = await asyncio.to_thread(up.store_counters)
            b: dict[str, Any] = {"runs_per_s": await throughput(side, "fast", args.runs)}
            b["cpu_ms_per_cycle"] = {
                role: (spent - cpu.get(role, 0.0)) * 1000 / args.runs
                for role, spent in sorted(up.cpu_by_role().items())
            }
            commands, aof = await asyncio.to_thread(up.store_counters)
            b["store_per_cycle"] = {
                "redis_commands": (commands - store[0]) / args.runs,
                # a rewrite of the AOF in the phase shrinks it: no figure then
                "aof_bytes": (aof - store[1]) / args.runs if aof >= store[1] else None,
            }
            note("broker throughput", b)
            b["p50_ms"], b["p99_ms"] = await latency(side, args.latency)
            note("broker latency", b)
            b["race"] = await side.race()
            if args.slow_runs:
                b["slow"] = await slow_broker(side, args.slow_runs)
            note("broker done", b)
            out[BROKER] = b
    finally:
        up.stop()

    out[ALONE] = await in_process_phases(ALONE, PydanticAISide(), args)  # the floor, always
    if args.broker_only:
        return {name: out[name] for name in SIDES if name in out}
    async with sqlite_saver(tmp / "lg.sqlite") as saver:
        slow = LangGraphSide(saver, slow_s=args.slow_s)
        out[LG_SQLITE] = await in_process_phases(LG_SQLITE, LangGraphSide(saver), args, slow)
    with postgres() as pg:
        async with pg_saver(pg.uri) as saver:
            slow = LangGraphSide(saver, slow_s=args.slow_s)
            side = LangGraphSide(saver)
            out[LG_POSTGRES] = await in_process_phases(LG_POSTGRES, side, args, slow, pg)
        # last: DBOS makes its thread pool this loop's default executor, and shuts it on exit
        import dbos_side

        async with dbos_side.launched(pg.uri):
            out[WITH_DBOS] = await in_process_phases(WITH_DBOS, dbos_side.DBOSSide(), args, pg=pg)
    return {name: out[name] for name in SIDES if name in out}


async def in_process_phases(
    name: str, side: Any, args: argparse.Namespace, slow: Any = None, pg: Postgres | None = None
) -> dict[str, Any]:
    """The phases of a side that runs in this process (pydantic-ai alone, DBOS, LangGraph);
    `slow` runs the slow phase if not the side itself; `pg` is the PostgreSQL it writes to."""
    await throughput(side, "fast", args.runs)  # warm up (the module's docstring)
    cpu, pg_cpu = time.process_time(), pg.cpu_seconds() if pg else 0.0
    counters = await pg.counters() if pg else (0, 0)
    r: dict[str, Any] = {"runs_per_s": await throughput(side, "fast", args.runs)}
    r["cpu_ms_per_cycle"] = {"this process": (time.process_time() - cpu) * 1000 / args.runs}
    if pg:
        r["cpu_ms_per_cycle"]["postgres"] = (pg.cpu_seconds() - pg_cpu) * 1000 / args.runs
        xacts, wal = await pg.counters()
        r["store_per_cycle"] = {
            "pg_write_transactions": (xacts - counters[0]) / args.runs,
            "wal_bytes": (wal - counters[1]) / args.runs,
        }
    note(f"{name} throughput", r)
    r["p50_ms"], r["p99_ms"] = await latency(side, args.latency)
    note(f"{name} latency", r)
    r["race"] = await side.race()
    if args.slow_runs:
        slow = slow or side
        began = time.perf_counter()
        cycles = asyncio.gather(*(slow.cycle("slow") for _ in range(args.slow_runs)))
        try:
            await asyncio.wait_for(cycles, PHASE_TIMEOUT_S)
        except TimeoutError:
            note(f"{name} slow phase timed out", {})
        took = time.perf_counter() - began
        r["slow"] = {"seconds": took, "runs_per_s": args.slow_runs / took}
    note(f"{name} done", r)
    return r


def note(what: str, figures: dict[str, Any]) -> None:
    """Progress on stderr (a long run shows where it is)."""
    print(f"  {what}: {json.dumps(figures, default=str)[:300]}", file=sys.stderr, flush=True)


def _cpu(figures: dict[str, Any]) -> str:
    cpu = figures.get("cpu_ms_per_cycle")
    if not cpu:
        return ""
    parts = ", ".join(f"{who} {ms:.1f}" for who, ms in sorted(cpu.items(), key=lambda kv: -kv[1]))
    return f"{sum(cpu.values()):.1f} ms ({parts})"


def _store(figures: dict[str, Any]) -> str:
    store = figures.get("store_per_cycle")
    if not store:
        return ""
    if "redis_commands" in store:
        aof = store["aof_bytes"]
        written = f"{aof / 1024:.1f} kB AOF" if aof is not None else "AOF rewritten"
        return f"{store['redis_commands']:.0f} Redis commands, {written}"
    return f"{store['pg_write_transactions']:.1f} write transactions, {store['wal_bytes'] / 1024:.1f} kB WAL"  # fmt: skip


def table(res: dict[str, Any]) -> str:
    names = list(res)

    def row(label: str, cells: list[str]) -> str:
        return f"| {label} | " + " | ".join(cells) + " |"

    race = []
    for n in names:
        r = res[n]["race"]
        how = r.get("http") or r.get("results")
        race.append(f"tool ran {r['tool_ran']}x, {'+'.join(map(str, how))}")
    rows = [
        row("", names),
        "|---|" + "---|" * len(names),
        row("runs/s, whole cycle, started at once", [f"{res[n]['runs_per_s']:.1f}" for n in names]),
        row("decision -> run finished, p50 / p99",
            [f"{res[n]['p50_ms']:.1f} / {res[n]['p99_ms']:.1f} ms" for n in names]),
        row("two deciders approve one paused run", race),
        row("CPU per cycle, by process (throughput phase)", [_cpu(res[n]) for n in names]),
        row("written to the store per cycle", [_store(res[n]) for n in names]),
    ]  # fmt: skip
    if all("slow" in res[n] for n in names):
        rows.append(row("slow model (`--slow-s` per call, 2 calls), runs/s", [f"{res[n]['slow']['runs_per_s']:.1f} ({res[n]['slow']['seconds']:.1f} s)" for n in names]))  # fmt: skip
    s = res[names[0]].get("slow")
    if s:
        memory = f"{s['mb_per_run_in_flight']:.2f} MB ({s['rss_base_mb']:.0f} -> {s['rss_peak_mb']:.0f} MB, {s['in_flight_at_peak']} in flight)"  # fmt: skip
        rows.append(row("worker memory per run in flight", [memory] + [""] * (len(names) - 1)))
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200, help="runs started at once")
    parser.add_argument("--latency", type=int, default=50, help="one-at-a-time cycles")
    parser.add_argument("--slow-runs", type=int, default=200, help="0 skips the slow phase")
    parser.add_argument("--slow-s", type=float, default=1.0, help="sleep per model call")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--broker-code", type=Path, default=ROOT,
        help="run `up` from this checkout instead (to compare worker designs)",
    )  # fmt: skip
    parser.add_argument(
        "--broker-only", action="store_true",
        help="the broker and pydantic-ai alone (its floor) only",
    )  # fmt: skip
    parser.add_argument(
        "--up-workers", type=int, default=None, help="`up --workers N` (default: up's own)"
    )
    parser.add_argument(
        "--fsync", choices=["always", "everysec"], default="always",
        help="the embedded Redis's appendfsync (APPROVAL_BROKER_REDIS_FSYNC for `up`)",
    )  # fmt: skip
    args = parser.parse_args()
    os.environ["BENCH_MODEL_SLEEP_S"] = str(args.slow_s)
    tmp = Path(tempfile.mkdtemp(prefix="bench-agents-"))
    try:
        res = asyncio.run(measure(args, tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(json.dumps(res))
        return
    print(table(res))
    b, alone, dbos = res[BROKER], res[ALONE], res.get(WITH_DBOS)
    versus_dbos = (
        f"{b['runs_per_s'] / dbos['runs_per_s']:.2f}x DBOS + pydantic-ai; " if dbos else ""
    )
    print(f"\ncycles/s: {b['runs_per_s'] / alone['runs_per_s']:.2f}x pydantic-ai alone (target >= 0.8x), "
          f"{versus_dbos}p50 {b['p50_ms']:.1f} ms (target <= 10 ms)")  # fmt: skip


if __name__ == "__main__":
    main()
