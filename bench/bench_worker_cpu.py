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
   CPU and Redis commands per job.

The worker's figure in `bench_agents.py` is about 1 (inside 2) + 2 + two jobs of 3, plus the
hand-offs between the slot threads, the shared loop and the threads that run Redis calls.
"""

from __future__ import annotations

import argparse
import asyncio
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
from pydantic_ai import DeferredToolRequests, DeferredToolResults  # noqa: E402
from pydantic_ai.capabilities import AbstractCapability  # noqa: E402
from pydantic_ai.messages import ModelMessagesTypeAdapter  # noqa: E402
from redis import Redis  # noqa: E402
from rq import Queue  # noqa: E402
from rq.serializers import JSONSerializer  # noqa: E402

from broker.domain.config import parse_config  # noqa: E402
from broker.domain.models import Decision  # noqa: E402
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=500, help="cycles per measurement")
    parser.add_argument("--jobs", type=int, default=300, help="RQ jobs")
    args = parser.parse_args()
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


if __name__ == "__main__":
    main()
