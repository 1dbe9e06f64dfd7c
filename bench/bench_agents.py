"""The whole approval cycle of an agent run, beside LangGraph's interrupt()/Command(resume=...).

    uv run --group bench python bench/bench_agents.py [--runs 200] [--latency 50] [--json]
        [--broker-only] [--fsync always|everysec]

One cycle: a run starts, its (fake, instant) model calls a tool that needs approval, the run
pauses durably, a decision arrives, the run resumes, the tool runs once, the run finishes.

* approval-broker: `approval-broker up` (embedded Redis, API, a worker process per core (at
  most 4) unless `--up-workers N`, notifier, sweeper) as the user runs it; runs started
  over `POST /v1/runs`, decided over `POST /v1/requests/{id}/decision`, followed with
  long-polls `GET /v1/runs/{id}?wait=30` (bench/fake_agents.py).
* LangGraph: a graph `model -> approval (interrupt) -> model`, resumed with `Command(resume=...)`,
  on `AsyncPostgresSaver` (a PostgreSQL this script starts: Debian's postgresql, a temp dir, a
  free loopback port, fsync on) and on `AsyncSqliteSaver` (a temp file), in this process.
* pydantic-ai alone: the same agents in this process with no broker and no durability (the
  history through JSON, a second run with `DeferredToolResults`): the floor under the broker's
  figures, what pydantic-ai's own agent loop costs on one core.

Printed: runs/s with `--runs` started at once (each approved as soon as it waits); decision ->
run finished one at a time, p50/p99; the double-approve race (two deciders approve one paused
run at once: how often the tool ran, the HTTP codes); and a slow-model phase (each model call
sleeps `--slow-s` asynchronously, two calls per run): runs/s and, for the broker, the worker's
memory per run in flight (RSS growth / runs in flight at the peak).

Other processes on the machine share its cores: figures are as measured, in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypedDict

import aiohttp
from redis import Redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from benchlib import cpu_seconds, pct  # noqa: E402
from fake_agents import CONFIG, ran_key  # noqa: E402

from broker.redis.embedded import free_port, running_local_url  # noqa: E402

WAIT_S = 30
"""How long one long-poll on a run (GET /v1/runs/{id}?wait=) waits before asking again."""
IDLE_S = 3.0
"""How long the bench's client keeps an idle connection: below the API's keep-alive (5 s)."""
PHASE_TIMEOUT_S = 300.0
"""A phase that takes longer is reported as it stands, not waited for."""

Flow = Callable[[str], Awaitable[float]]


# ---- approval-broker on `up` ------------------------------------------------------------------


class Up:
    """`approval-broker up` in a temp dir, and an HTTP client of its API."""

    def __init__(
        self, tmp: Path, code: Path = ROOT, workers: int | None = None, fsync: str = "always"
    ) -> None:
        self.tmp = tmp
        tmp.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.token = secrets.token_urlsafe(32)
        self.deciders = [secrets.token_urlsafe(32) for _ in range(2)]
        approvers = "".join(
            f'\n[approvers.decider{i}]\ntoken_sha256 = "{hashlib.sha256(t.encode()).hexdigest()}"\n'
            for i, t in enumerate(self.deciders)
        )
        (tmp / "broker.toml").write_text(CONFIG + approvers)
        env = {k: v for k, v in os.environ.items() if not k.startswith("APPROVAL_BROKER_")}
        env |= {
            "APPROVAL_BROKER_CONFIG": str(tmp / "broker.toml"),
            "APPROVAL_BROKER_ADMIN_TOKEN": self.token,
            "PYTHONPATH": os.pathsep.join([str(ROOT / "bench"), str(code)]),
            "BENCH_MODEL_SLEEP_S": os.environ.get("BENCH_MODEL_SLEEP_S", "1.0"),
            "APPROVAL_BROKER_REDIS_FSYNC": fsync,
        }
        self.log = (tmp / "up.log").open("w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "approval_broker", "up", "--port", str(self.port),
             "--data-dir", str(tmp / "data"),
             *(["--workers", str(workers)] if workers else [])],
            env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        self.base = f"http://127.0.0.1:{self.port}"
        self.redis: Redis | None = None

    async def ready(self, client: aiohttp.ClientSession, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(aiohttp.ClientError):
                workers = len(self.worker_pids())
                async with client.get("/healthz") as health:
                    healthy = health.status == 200
                if healthy and workers:
                    if (self.tmp / "up.log").read_text().count("worker ready") >= workers:
                        url = running_local_url(self.tmp / "data" / "redis")
                        assert url, "no embedded Redis found"
                        self.redis = Redis.from_url(url)
                        return
            await asyncio.sleep(0.2)
        raise SystemExit(f"`up` did not come up; see {self.tmp / 'up.log'}")

    def role_pids(self) -> dict[str, list[int]]:
        """`up`'s child processes by role (`api`, `worker`, `notifier`, `sweeper`, `redis`)."""
        roles: dict[str, list[int]] = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError):
                fields = stat.read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) != self.process.pid:
                    continue
                cmd = (stat.parent / "cmdline").read_bytes().split(b"\0")
                if any(b"redis-server" in part for part in cmd):
                    role = "redis"
                else:
                    after = (
                        cmd[cmd.index(b"approval_broker") + 1 :]
                        if b"approval_broker" in cmd
                        else []
                    )
                    role = after[0].decode() if after else "other"
                roles.setdefault(role, []).append(int(stat.parent.name))
        return roles

    def errors(self, last: int = 5) -> str:
        """The last error lines of `up`'s log, to show with a failed request."""
        lines = (self.tmp / "up.log").read_text(errors="replace").splitlines()
        return "\n".join([line for line in lines if "rror" in line][-last:])

    def worker_pids(self) -> list[int]:
        """The agent worker processes `up` started (up's default unless `--up-workers`)."""
        return self.role_pids().get("worker", [])

    def rss_mb(self) -> float:
        """Resident memory of every worker process, summed."""
        total = 0.0
        for pid in self.worker_pids():
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) / 1024
        return total

    def cpu_by_role(self) -> dict[str, float]:
        """CPU seconds (user + system) so far of each role's processes, summed per role."""
        return {
            role: sum(cpu_seconds(pid) for pid in pids) for role, pids in self.role_pids().items()
        }

    def tool_ran(self, run_id: str) -> int:
        assert self.redis is not None
        return int(self.redis.get(ran_key("ab:", run_id)) or 0)

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.log.close()


class BrokerSide:
    def __init__(self, up: Up, client: aiohttp.ClientSession) -> None:
        self.up = up
        self.client = client
        self.in_flight = 0
        self.peak = 0

    async def start(self, agent: str) -> str:
        async with self.client.post("/v1/runs", json={"agent": agent, "prompt": "Refund A1."}) as r:
            r.raise_for_status()
            return str((await r.json())["run_id"])

    async def until(self, run_id: str, statuses: set[str]) -> dict[str, Any]:
        """The run once its status is one of `statuses`, followed with long-polls (the API
        answers when the run waits for a person or has ended), not with a polling interval."""
        while True:
            async with self.client.get(f"/v1/runs/{run_id}", params={"wait": WAIT_S}) as r:
                run = await r.json()
                if r.status != 200:
                    raise SystemExit(f"GET /v1/runs/{run_id}: {r.status} {run}\n{self.up.errors()}")
            if run["status"] in statuses:
                return dict(run)
            if run["status"] == "failed":
                raise SystemExit(f"run {run_id} failed: {run.get('error')}")

    async def decide(self, request_id: str, token: str | None = None) -> int:
        async with self.client.post(
            f"/v1/requests/{request_id}/decision",
            json={"outcome": "approved"},
            headers={"Authorization": f"Bearer {token}"} if token else None,
        ) as r:
            return r.status

    async def cycle(self, agent: str) -> float:
        """One whole cycle; returns decision -> finished, in seconds."""
        run_id = await self.start(agent)
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            run = await self.until(run_id, {"waiting"})
            began = time.perf_counter()
            code = await self.decide(run["pending"][0])
            assert code == 200, code
            await self.until(run_id, {"finished"})
            return time.perf_counter() - began
        finally:
            self.in_flight -= 1

    async def race(self) -> dict[str, Any]:
        run_id = await self.start("fast")
        run = await self.until(run_id, {"waiting"})
        request_id = run["pending"][0]  # two people, each with a token of their own
        codes = await asyncio.gather(*(self.decide(request_id, t) for t in self.up.deciders))
        await self.until(run_id, {"finished"})
        return {"tool_ran": self.up.tool_ran(run_id), "http": sorted(codes)}


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


# ---- LangGraph ----------------------------------------------------------------------------------


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


@contextlib.contextmanager
def postgres(tmp: Path) -> Any:
    """A throwaway PostgreSQL (fsync on) on a free loopback port; yields its URI."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if not found:
        raise SystemExit(
            "PostgreSQL is not installed: apt-get update && apt-get install -y postgresql"
        )
    bin_dir = found[-1].parent
    tmp = Path(tempfile.mkdtemp(prefix="bench-pg-", dir=tmp))
    tmp.chmod(0o755)
    data = tmp / "pg"
    data.mkdir()
    port = free_port()
    as_user: list[str] = []
    if os.geteuid() == 0:  # initdb refuses root
        shutil.chown(tmp, "postgres")
        shutil.chown(data, "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    run = [*as_user]
    subprocess.run([*run, str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", "bench"],
                   check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    opts = f"-p {port} -k {tmp} -c listen_addresses=127.0.0.1 -c fsync=on -c max_connections=200"
    subprocess.run([*run, str(bin_dir / "pg_ctl"), "-D", str(data), "-o", opts, "-w",
                    "-l", str(tmp / "pg.log"), "start"], check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    try:
        yield f"postgresql://bench@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*run, str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "stop"],
                       check=False, stdout=subprocess.DEVNULL)  # fmt: skip
        shutil.rmtree(tmp, ignore_errors=True)


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


# ---- the phases -----------------------------------------------------------------------------------


async def throughput(side: Any, agent: str, n: int) -> float:
    began = time.perf_counter()
    await asyncio.gather(*(side.cycle(agent) for _ in range(n)))
    return n / (time.perf_counter() - began)


async def latency(side: Any, n: int) -> tuple[float, float]:
    took = [await side.cycle("fast") for _ in range(n)]
    return pct(took, 0.50) * 1000, pct(took, 0.99) * 1000


async def slow_broker(side: BrokerSide, n: int) -> dict[str, float]:
    base = side.up.rss_mb()
    peak_rss = base
    peak_flight = 0
    done = asyncio.Event()

    async def sample() -> None:
        nonlocal peak_rss, peak_flight
        while not done.is_set():
            rss = side.up.rss_mb()
            if rss > peak_rss:
                peak_rss, peak_flight = rss, side.in_flight
            await asyncio.sleep(0.1)

    sampler = asyncio.create_task(sample())
    began = time.perf_counter()
    await asyncio.gather(*(side.cycle("slow") for _ in range(n)))
    took = time.perf_counter() - began
    done.set()
    await sampler
    per_run = (peak_rss - base) / peak_flight if peak_flight else 0.0
    return {"seconds": took, "runs_per_s": n / took, "rss_base_mb": base,
            "rss_peak_mb": peak_rss, "in_flight_at_peak": peak_flight,
            "mb_per_run_in_flight": per_run}  # fmt: skip


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
            await throughput(side, "fast", 20)  # warm up
            cpu = up.cpu_by_role()
            b: dict[str, Any] = {"runs_per_s": await throughput(side, "fast", args.runs)}
            b["cpu_ms_per_cycle"] = {
                role: (spent - cpu.get(role, 0.0)) * 1000 / args.runs
                for role, spent in sorted(up.cpu_by_role().items())
            }
            note("broker throughput", b)
            b["p50_ms"], b["p99_ms"] = await latency(side, args.latency)
            note("broker latency", b)
            b["race"] = await side.race()
            if args.slow_runs:
                b["slow"] = await slow_broker(side, args.slow_runs)
            note("broker done", b)
            out["approval-broker"] = b
    finally:
        up.stop()

    if args.broker_only:
        return out
    out["pydantic-ai alone, no durability"] = await in_process_phases(PydanticAISide(), args)
    with postgres(Path(tempfile.gettempdir())) as uri:
        async with pg_saver(uri) as saver:
            out["LangGraph + PostgresSaver"] = await in_process_phases(
                LangGraphSide(saver), args, saver
            )
    async with sqlite_saver(tmp / "lg.sqlite") as saver:
        out["LangGraph + SqliteSaver"] = await in_process_phases(LangGraphSide(saver), args, saver)
    return out


async def in_process_phases(
    side: PydanticAISide | LangGraphSide, args: argparse.Namespace, saver: Any = None
) -> dict[str, Any]:
    """The phases of a side that runs in this process: LangGraph on `saver`, or pydantic-ai."""
    await throughput(side, "fast", 20)
    r: dict[str, Any] = {"runs_per_s": await throughput(side, "fast", args.runs)}
    note("throughput", r)
    r["p50_ms"], r["p99_ms"] = await latency(side, args.latency)
    note("latency", r)
    r["race"] = await side.race()
    if args.slow_runs:
        slow = side if saver is None else LangGraphSide(saver, slow_s=args.slow_s)
        began = time.perf_counter()
        cycles = asyncio.gather(*(slow.cycle("slow") for _ in range(args.slow_runs)))
        try:
            await asyncio.wait_for(cycles, PHASE_TIMEOUT_S)
        except TimeoutError:
            note("slow phase timed out", {})
        took = time.perf_counter() - began
        r["slow"] = {"seconds": took, "runs_per_s": args.slow_runs / took}
    note("done", r)
    return r


def note(what: str, figures: dict[str, Any]) -> None:
    """Progress on stderr (a long run shows where it is)."""
    print(f"  {what}: {json.dumps(figures, default=str)[:300]}", file=sys.stderr, flush=True)


def table(res: dict[str, Any]) -> str:
    names = list(res)
    rows = [
        "| | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
        "| runs/s, whole cycle, started at once | "
        + " | ".join(f"{res[n]['runs_per_s']:.1f}" for n in names)
        + " |",  # fmt: skip
        "| decision -> run finished, p50 / p99 | "
        + " | ".join(f"{res[n]['p50_ms']:.1f} / {res[n]['p99_ms']:.1f} ms" for n in names)
        + " |",  # fmt: skip
    ]
    race = []
    for n in names:
        r = res[n]["race"]
        how = r.get("http") or r.get("results")
        race.append(f"tool ran {r['tool_ran']}x, {'+'.join(map(str, how))}")
    rows.append("| two deciders approve one paused run | " + " | ".join(race) + " |")
    if all("slow" in res[n] for n in names):
        rows.append("| slow model (1 s/call, 2 calls), runs/s | " + " | ".join(f"{res[n]['slow']['runs_per_s']:.1f} ({res[n]['slow']['seconds']:.1f} s)" for n in names) + " |")  # fmt: skip
        s = res[names[0]]["slow"]
        cpu = res[names[0]]["cpu_ms_per_cycle"]
        by_role = ", ".join(f"{role} {ms:.1f}" for role, ms in sorted(cpu.items(), key=lambda kv: -kv[1]))  # fmt: skip
        rows.append(f"| CPU per cycle, by process of `up` | {sum(cpu.values()):.1f} ms ({by_role}) |" + " |" * (len(names) - 1))  # fmt: skip
        rows.append(f"| worker memory per run in flight | {s['mb_per_run_in_flight']:.2f} MB ({s['rss_base_mb']:.0f} -> {s['rss_peak_mb']:.0f} MB, {s['in_flight_at_peak']} in flight) |" + " |" * (len(names) - 1))  # fmt: skip
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
    parser.add_argument("--broker-only", action="store_true", help="skip the LangGraph side")
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
    if args.broker_only:
        return
    b, pg = res["approval-broker"], res["LangGraph + PostgresSaver"]
    print(f"\ncycles/s vs LangGraph+Postgres: {b['runs_per_s'] / pg['runs_per_s']:.2f}x (target >= 2x); "
          f"p50 {b['p50_ms']:.1f} ms vs {pg['p50_ms']:.1f} ms (target <= 15 ms and <= Postgres)")  # fmt: skip


if __name__ == "__main__":
    main()
