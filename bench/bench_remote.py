"""Benchmark agents outside the fleet: decision -> tool executed, live vs stop-and-resume, and
long-poll wake-up.

Starts an embedded Redis and `approval-broker api` as a subprocess; a pydantic-ai agent (a
scripted FunctionModel, one approval per run) runs in this process with `BrokerApprovals`:

1. long-poll wake-up: a request is decided while a `GET /v1/requests/{id}?wait=30` waits on it;
   the time from the decision to the waiter's answer;
2. live: `live_wait_s=30`; a person (a thread) approves over HTTP; the time from the decision
   being sent to the approved tool running, in the same agent run;
3. stop-and-resume: `live_wait_s=0`, the run ends with `DeferredToolRequests`; the app waits with
   `results_for(..., wait_s=30)` (a long-poll) and starts the agent again from the history;
4. the same agent on the fleet (`approval-broker worker`, resumer inside): with `live_wait_s`
   (the job that paused goes on) and without (outbox -> resumer -> a new RQ job).

Usage: uv run python bench/bench_remote.py [--runs 50]
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from pathlib import Path
from typing import Any

from approval_broker_client import BrokerApprovals, RemoteBroker
from benchlib import bench_site, pct, start_api, start_role, stop_roles
from pydantic_ai import Agent, DeferredToolRequests
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from redis import Redis

from broker.domain.models import Decision, NewRequest
from broker.domain.principals import hash_token
from broker.facade import Broker

AGENT_TOKEN, PERSON_TOKEN = "bench-agent", "bench-person"
CONFIG = f"""
[queues.default]
channels = ["inbox"]
timeout_s = 3600

[approvers.agent]
token_sha256 = "{hash_token(AGENT_TOKEN)}"
roles = ["requester"]

[agents.fleet_live]
path = "bench_remote:fleet_agent"
live_wait_s = 30

[agents.fleet_stop]
path = "bench_remote:fleet_agent"

[approvers.person]
token_sha256 = "{hash_token(PERSON_TOKEN)}"
roles = ["finance"]
"""


def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    last = messages[-1]
    if isinstance(last, ModelRequest) and any(isinstance(p, ToolReturnPart) for p in last.parts):
        return ModelResponse(parts=[TextPart("done")])
    return ModelResponse(parts=[ToolCallPart("refund", {"amount": 120}, tool_call_id="call-1")])


class Person:
    """Approves every pending request over HTTP as soon as it sees it; notes when it decided."""

    def __init__(self, base_url: str, broker: Broker) -> None:
        self.client = RemoteBroker(base_url, PERSON_TOKEN)
        self.broker = broker
        self.decided_at: dict[str, float] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stop.is_set():
            for request in self.broker.list_requests(status="pending"):
                sent = time.perf_counter()
                self.client.approve(request.id)
                self.decided_at[request.id] = sent
            time.sleep(0.002)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.client.close()


def make_agent(capability: BrokerApprovals, executed: list[float]) -> Agent[None, Any]:
    agent: Agent[None, Any] = Agent(
        FunctionModel(script), output_type=[str, DeferredToolRequests], capabilities=[capability]
    )

    @agent.tool_plain(requires_approval=True)
    def refund(amount: float) -> str:
        executed.append(time.perf_counter())
        return f"refunded {amount}"

    return agent


def tool_latencies(
    agent_client: RemoteBroker, person: Person, runs: int, live: bool
) -> list[float]:
    """Decision sent -> approved tool running, in ms, for `runs` agent runs."""
    executed: list[float] = []
    capability = BrokerApprovals(agent_client, live_wait_s=30 if live else 0)
    agent = make_agent(capability, executed)
    out = []
    for _ in range(runs):
        before = set(person.decided_at)
        result = agent.run_sync("Refund $120")
        # without a live wait the run pauses, unless the person was faster than the run's
        # own look for a decision (the decision path is one step now): then it went on
        if not live and isinstance(result.output, DeferredToolRequests):
            results = agent_client.results_for(result.output, wait_s=30)
            result = agent.run_sync(
                message_history=result.all_messages(), deferred_tool_results=results
            )
        assert result.output == "done", result.output
        while len(person.decided_at) == len(before):  # the person's HTTP answer may lag the tool
            time.sleep(0.001)
        [rid] = set(person.decided_at) - before
        out.append((executed[-1] - person.decided_at[rid]) * 1000)
    return out


def _long_poll(client: RemoteBroker, request_id: str, answered: list[float]) -> None:
    client.get_request(request_id, wait=30)
    answered.append(time.perf_counter())


def wake_latencies(base_url: str, broker: Broker, n: int) -> list[float]:
    """Decision recorded -> long-poll answered, in ms."""
    out = []
    with RemoteBroker(base_url, PERSON_TOKEN) as client:
        for i in range(n):
            request = broker.create_request(NewRequest(tool_name="refund", args={"i": i}))
            answered: list[float] = []
            waiter = threading.Thread(target=_long_poll, args=(client, request.id, answered))
            waiter.start()
            time.sleep(0.05)  # let the long-poll reach the API before the decision
            t0 = time.perf_counter()
            broker.decide(request.id, Decision(outcome="approved"), decided_by="bench")
            waiter.join(30)
            if i > 0:  # the first one warms the API's connections up
                out.append((answered[0] - t0) * 1000)
    return out


EXECUTED = "bench:executed"
fleet_agent: Agent[None, Any] = Agent(
    FunctionModel(script), output_type=[str, DeferredToolRequests]
)


@fleet_agent.tool_plain(requires_approval=True)
def refund(amount: float) -> str:
    """On the fleet: note when the approved tool ran (wall clock, shared with the bench)."""
    Redis.from_url(os.environ["APPROVAL_BROKER_REDIS_URL"]).rpush(EXECUTED, f"{time.time():.6f}")
    return f"refunded {amount}"


def _until(predicate: Any, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise SystemExit("the fleet did not get there within 60 s")
        time.sleep(0.002)
    return value


def fleet_latencies(broker: Broker, base_url: str, agent: str, runs: int) -> list[float]:
    """On the fleet: decision sent -> approved tool running, in ms (wall clock)."""
    from broker.runs.starting import start_run

    out = []
    with RemoteBroker(base_url, PERSON_TOKEN) as person:
        for i in range(runs):
            run = start_run(broker, agent, f"Refund $120 #{i}")
            [rid] = _until(lambda run_id=run.id: broker.get_run(run_id).pending)
            before = broker.redis.llen(EXECUTED)
            sent = time.time()
            person.approve(rid)
            _until(lambda n=before: broker.redis.llen(EXECUTED) > n)
            out.append((float(broker.redis.lindex(EXECUTED, -1) or 0) - sent) * 1000)
            _until(lambda run_id=run.id: broker.get_run(run_id).status.value == "finished")
    return out


def line(label: str, values: list[float]) -> str:
    return f"{label}: p50 {pct(values, 0.5):.1f} ms, p99 {pct(values, 0.99):.1f} ms ({len(values)} samples)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--runs", type=int, default=50, help="agent runs (and long-polls) per phase"
    )
    opts = parser.parse_args()

    with bench_site(CONFIG) as (env, redis, broker, _):
        api, base_url = start_api(env)
        try:
            print(
                line(
                    "long-poll wake-up (decision -> waiter answered)",
                    wake_latencies(base_url, broker, opts.runs + 1),
                )
            )
            person = Person(base_url, broker)
            with RemoteBroker(base_url, AGENT_TOKEN) as agent_client:
                live = tool_latencies(agent_client, person, opts.runs, live=True)
                stopped = tool_latencies(agent_client, person, opts.runs, live=False)
            person.close()
            print(line("live (live_wait_s=30): decision sent -> tool executed", live))
            print(
                line(
                    "stop-and-resume (results_for + new run): decision sent -> tool executed",
                    stopped,
                )
            )
            worker_env = {**env, "PYTHONPATH": str(Path(__file__).parent)}
            worker, _ = start_role(["worker"], worker_env, "worker ready")
            try:
                fleet_live = fleet_latencies(broker, base_url, "fleet_live", opts.runs)
                fleet_stop = fleet_latencies(broker, base_url, "fleet_stop", opts.runs)
            finally:
                stop_roles(worker)
            print(
                line("fleet, live_wait_s=30 (same job): decision sent -> tool executed", fleet_live)
            )
            print(
                line(
                    "fleet, stop-and-resume (outbox, resumer, new RQ job): decision sent -> tool executed",
                    fleet_stop,
                )
            )
            print(
                f"machine: {os.cpu_count()} CPUs, one uvicorn process, one RQ worker (+ resumer), "
                "embedded Redis, loopback"
            )
        finally:
            stop_roles(api)


if __name__ == "__main__":
    main()
