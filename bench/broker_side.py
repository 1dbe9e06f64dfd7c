"""approval-broker's side of bench_agents: `approval-broker up` as the user runs it, and a client.

`up` (embedded Redis, API, a worker process per core (at most 4) unless told, notifier,
sweeper) in a temp dir, with bench/fake_agents.py's agents; runs started over `POST /v1/runs`,
decided over `POST /v1/requests/{id}/decision` (two approvers with tokens of their own, for the
race), followed with long-polls `GET /v1/runs/{id}?wait=30`. It tells each role's CPU, the
workers' memory, and Redis's command count and AOF size, for the figures per cycle.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
from benchlib import cpu_seconds
from fake_agents import CONFIG, ran_key
from redis import Redis

from broker.redis.embedded import free_port, running_local_url

ROOT = Path(__file__).resolve().parent.parent
WAIT_S = 30
"""How long one long-poll on a run (GET /v1/runs/{id}?wait=) waits before asking again."""
IDLE_S = 3.0
"""How long the bench's client keeps an idle connection: below the API's keep-alive (5 s)."""


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
            cwd=code,  # `python -m` puts the working directory first on the path: run `code`'s
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

    def store_counters(self) -> tuple[int, int]:
        """(commands Redis has processed, its AOF's size in bytes) so far: their growth over a
        phase is what it sent to Redis and what Redis appended (and fsynced) for it."""
        assert self.redis is not None
        stats, persistence = self.redis.info("stats"), self.redis.info("persistence")
        return int(stats["total_commands_processed"]), int(persistence["aof_current_size"])

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
