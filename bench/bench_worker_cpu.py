"""Where an agent worker's CPU per approval cycle goes, each part measured alone in this process.

    uv run python bench/bench_worker_cpu.py [--cycles 500] [--jobs 300]

`bench_agents.py` gives the worker's CPU per whole cycle on `up`; this splits it, with
`time.process_time` (CPU, not wall time, so a busy machine moves it less):

1. pydantic-ai alone: the fake agent of `bench_agents.py` run to its pause, its history through
   JSON, and resumed with `DeferredToolResults`, by `Agent.run`, by `Agent.iter`, and by
   `Agent.iter` with a no-op capability (the broker's tool guard is a capability);
2. the broker's runner: `AgentRunner.advance` for round 0 (start to pause, the round's requests
   created) and round 1 (resume to finished, checkpoints and the tool guard) on an embedded
   Redis, the decision in between not counted; no RQ;
3. RQ: one no-op job through the worker's slots (`workers.slots.Slots`, RQ's SimpleWorker API),
   CPU and Redis commands per job;
4. the worker process itself (`approval-broker worker`, its slots, shared loop and resumer, as
   `up` starts it, receipts on), `--runs` cycles started at once by this process through the
   facade (start, then approve each round as it pauses, `Broker.decide`): the worker's CPU and
   Redis commands per whole cycle, with the embedded Redis fsyncing every write (`--fsync`).
   `--spy FILE` records the worker with py-spy (`--gil`, raw) during that phase.

The worker's figure in `bench_agents.py` is about 1 (inside 2) + 2 + two jobs of 3, plus the
hand-offs between the slot threads, the shared loop and the threads that run Redis calls; 4
measures that whole directly.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import fake_agents  # noqa: E402
from benchlib import cpu_seconds  # noqa: E402
from pydantic_ai import DeferredToolRequests, DeferredToolResults  # noqa: E402
from pydantic_ai.capabilities import AbstractCapability  # noqa: E402
from pydantic_ai.messages import ModelMessagesTypeAdapter  # noqa: E402
from redis import Redis  # noqa: E402
from rq import Queue  # noqa: E402
from rq.serializers import JSONSerializer  # noqa: E402

from broker.domain.config import parse_config  # noqa: E402
from broker.domain.models import Decision  # noqa: E402
from broker.domain.receipts import new_key_pem  # noqa: E402
from broker.facade import Broker  # noqa: E402
from broker.redis.embedded import EmbeddedRedis  # noqa: E402
from broker.runs.agent_runner import AgentRunner  # noqa: E402
from broker.runs.starting import start_run  # noqa: E402
from workers.slots import Slots  # noqa: E402

WARM_UP = 30


class _Uncounted:
    """The fake agent's tool counts its runs in Redis; here nothing is counted."""

    def incr(self, key: str) -> None:
        pass


class _NoOp(AbstractCapability[Any]):
    """A capability that wraps each tool call and does nothing else (as the tool guard wraps)."""

    async def wrap_tool_execute(
        self, ctx: Any, *, call: Any, tool_def: Any, args: Any, handler: Any
    ) -> Any:
        return await handler(args)


async def _pydantic_ai_cycle(how: str) -> None:
    deps = fake_agents.Counter(_Uncounted(), "uncounted")  # type: ignore[arg-type]

    async def run(**kwargs: Any) -> Any:
        if how == "run":
            return await fake_agents.fast.run(deps=deps, **kwargs)
        capabilities = [_NoOp()] if how == "iter + capability" else None
        async with fake_agents.fast.iter(deps=deps, capabilities=capabilities, **kwargs) as r:
            async for _ in r:
                pass
        return r.result

    paused = await run(user_prompt="Refund A1.")
    assert isinstance(paused.output, DeferredToolRequests)
    stored = ModelMessagesTypeAdapter.dump_json(paused.all_messages())
    history = ModelMessagesTypeAdapter.validate_json(stored)
    results = DeferredToolResults(approvals={c.tool_call_id: True for c in paused.output.approvals})
    done = await run(message_history=history, deferred_tool_results=results)
    assert done.output == "refunded"


def pydantic_ai_alone(cycles: int) -> dict[str, float]:
    """CPU ms per cycle of the agent alone, three ways of driving it."""
    out = {}
    for how in ("run", "iter", "iter + capability"):

        async def measure(how: str = how) -> float:
            for _ in range(WARM_UP):
                await _pydantic_ai_cycle(how)
            began = time.process_time()
            for _ in range(cycles):
                await _pydantic_ai_cycle(how)
            return (time.process_time() - began) * 1000 / cycles

        out[how] = asyncio.run(measure())
    return out


def runner_rounds(redis: Redis, cycles: int) -> dict[str, float]:
    """CPU ms of `AgentRunner.advance` per round, and Redis commands per whole cycle."""
    broker = Broker(redis, parse_config(tomllib.loads(fake_agents.CONFIG)), prefix="ab:")
    runner = AgentRunner(broker)

    def cycle() -> tuple[float, float]:
        run = start_run(broker, "fast", "Refund A1.")
        began = time.process_time()
        runner.advance(run.id, 0)
        paused = time.process_time()
        (request,) = broker.round_requests(run.id, 1)
        broker.decide(request.id, Decision(outcome="approved"), decided_by="bench")
        resumed = time.process_time()
        runner.advance(run.id, 1)
        return paused - began, time.process_time() - resumed

    for _ in range(WARM_UP):
        cycle()
    redis.config_resetstat()
    first = second = 0.0
    for _ in range(cycles):
        a, b = cycle()
        first, second = first + a, second + b
    calls = sum(int(v["calls"]) for v in redis.info("commandstats").values())
    return {
        "round 0 (start to pause)": first * 1000 / cycles,
        "round 1 (resume to finished)": second * 1000 / cycles,
        "redis commands per cycle (start and decision included)": calls / cycles,
    }


def rq_jobs(redis: Redis, jobs: int) -> dict[str, float]:
    """CPU ms and Redis commands per no-op RQ job taken by the worker's slots."""
    queue = Queue("bench-worker-cpu", connection=redis, serializer=JSONSerializer)
    for _ in range(jobs):
        queue.enqueue("builtins.len", [1, 2], result_ttl=600)
    redis.config_resetstat()
    slots = Slots("bench-worker-cpu", redis, 4)
    began = time.process_time()
    slots.start(burst=True)
    slots.join()
    cpu = time.process_time() - began
    calls = sum(int(v["calls"]) for v in redis.info("commandstats").values())
    return {"CPU ms per job": cpu * 1000 / jobs, "redis commands per job": calls / jobs}


def worker_process(
    url: str, runs: int, tmp: Path, code: Path = ROOT, spy: str | None = None
) -> dict[str, float]:
    """CPU ms and Redis commands per whole cycle of one `approval-broker worker` process."""
    (tmp / "receipts.pem").write_bytes(new_key_pem())
    config_text = fake_agents.CONFIG + f'\n[receipts]\nkey_file = "{tmp / "receipts.pem"}"\n'
    (tmp / "broker.toml").write_text(config_text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPROVAL_BROKER_")}
    env |= {
        "APPROVAL_BROKER_CONFIG": str(tmp / "broker.toml"),
        "APPROVAL_BROKER_REDIS_URL": url,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "bench"), str(code)]),
    }
    log = (tmp / "worker.log").open("w")
    worker = subprocess.Popen(  # in `code`: `python -m` puts the working directory first
        [sys.executable, "-m", "approval_broker", "worker"],
        env=env,
        stdout=log,
        stderr=log,
        cwd=code,
    )
    redis = Redis.from_url(url)
    broker = Broker(redis, parse_config(tomllib.loads(config_text)), prefix="ab:")
    try:
        deadline = time.monotonic() + 120
        while "worker ready" not in (tmp / "worker.log").read_text():
            if time.monotonic() > deadline or worker.poll() is not None:
                raise SystemExit(f"the worker did not start: {(tmp / 'worker.log').read_text()}")
            time.sleep(0.2)
        _cycles(broker, WARM_UP)
        redis.config_resetstat()
        cpu = cpu_seconds(worker.pid)
        loop_cpu = _thread_cpu(worker.pid, worker.pid)
        profiler = None
        if spy:
            profiler = subprocess.Popen(
                ["py-spy", "record", "--gil", "--threads", "--pid", str(worker.pid), "--rate", "100",
                 "--format", "raw", "--output", spy, "--nonblocking"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
        began = time.perf_counter()
        _cycles(broker, runs)
        took = time.perf_counter() - began
        if profiler is not None:
            profiler.send_signal(2)
            profiler.wait(30)
        spent = cpu_seconds(worker.pid) - cpu
        loop_spent = _thread_cpu(worker.pid, worker.pid) - loop_cpu
        calls = sum(int(v["calls"]) for v in redis.info("commandstats").values())
        reads = int(redis.info("stats")["total_reads_processed"])
    finally:
        worker.terminate()
        worker.wait(30)
        log.close()
    return {
        "cycles/s": runs / took,
        "worker CPU ms per cycle": spent * 1000 / runs,
        "  of which its event loop's thread (the agents' coroutines)": loop_spent * 1000 / runs,
        "redis commands per cycle (start and decision included)": calls / runs,
        "redis round trips per cycle (start and decision included)": reads / runs,
    }


def _thread_cpu(pid: int, tid: int) -> float:
    """CPU seconds so far of one thread of a process (Linux /proc)."""
    try:
        fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cycles(broker: Broker, n: int) -> None:
    """Start `n` runs at once, approve each round as it pauses, until every run finished (the
    run-events stream says when: one XREAD follows them all)."""
    stream = broker.keys.run_events
    last = broker.redis.xrevrange(stream, count=1)
    position = last[0][0] if last else b"0-0"
    open_runs = {start_run(broker, "fast", "Refund A1.").id for _ in range(n)}
    while open_runs:
        for _, entries in broker.redis.xread({stream: position}, count=1000, block=5000) or []:
            for entry_id, fields in entries:
                position = entry_id
                run_id = fields[b"run_id"].decode()
                if run_id not in open_runs:
                    continue
                status = fields[b"status"].decode()
                if status == "waiting":
                    for request in broker.round_requests(
                        run_id, int(broker.run_fields(run_id)["round"])
                    ):
                        broker.decide(request.id, Decision(outcome="approved"), decided_by="bench")
                elif status == "finished":
                    open_runs.discard(run_id)
                else:
                    raise SystemExit(f"run {run_id} {status}: {broker.run_fields(run_id)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=500, help="cycles per measurement")
    parser.add_argument("--jobs", type=int, default=300, help="RQ jobs")
    parser.add_argument("--runs", type=int, default=500, help="cycles through the worker process")
    parser.add_argument("--fsync", choices=["always", "everysec"], default="always")
    parser.add_argument("--only-worker", action="store_true", help="only phase 4")
    parser.add_argument("--code", type=Path, default=ROOT, help="the worker from this checkout")
    parser.add_argument("--spy", help="py-spy the worker process in phase 4 into this file")
    args = parser.parse_args()
    if args.only_worker:
        tmp = Path(tempfile.mkdtemp(prefix="bench-worker-cpu-"))
        with EmbeddedRedis(tmp / "redis", fsync=args.fsync) as server:
            print("the worker process, whole cycles:", flush=True)
            for what, value in worker_process(
                server.url, args.runs, tmp, args.code, args.spy
            ).items():
                print(f"  {what}: {value:.2f}", flush=True)
        return
    print("pydantic-ai alone, CPU ms per cycle:", flush=True)
    for how, ms in pydantic_ai_alone(args.cycles).items():
        print(f"  Agent.{how}: {ms:.2f} ms", flush=True)
    with EmbeddedRedis(Path(tempfile.mkdtemp(prefix="bench-worker-cpu-"))) as server:
        redis = Redis.from_url(server.url)
        print("the broker's runner (AgentRunner.advance, no RQ):", flush=True)
        for what, value in runner_rounds(redis, args.cycles).items():
            print(f"  {what}: {value:.2f}", flush=True)
        print("RQ, one no-op job through the worker's slots:", flush=True)
        for what, value in rq_jobs(redis, args.jobs).items():
            print(f"  {what}: {value:.2f}", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="bench-worker-cpu-"))
    with EmbeddedRedis(tmp / "redis", fsync=args.fsync) as server:
        print("the worker process, whole cycles:", flush=True)
        for what, value in worker_process(server.url, args.runs, tmp, args.code, args.spy).items():
            print(f"  {what}: {value:.2f}", flush=True)


if __name__ == "__main__":
    main()
