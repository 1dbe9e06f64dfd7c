"""One trace for an approved run across real `api`, `notifier` and `worker` processes (OTLP).

The roles run as OS processes on a real Redis with the standard `OTEL_*` environment pointing
at a local OTLP/HTTP receiver (`tests.support.fakes.otlp_receiver`, decoding with `opentelemetry-proto`).
A run started with `POST /v1/runs` pauses on a refund that needs approval, the notifier delivers
it to a webhook, a person approves it over the API, which enqueues the resume itself,
and the tool runs: every span of that is in ONE trace, each parent is a span of it, and the
webhook got the trace in its `traceparent` header. With the collector down the same flow
completes (spans are dropped, never waited for).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.support.api_process import ADMIN, api_env
from tests.support.fakes.harness import SECRET
from tests.support.fakes.otlp_receiver import OtlpReceiver, Span
from tests.support.fakes.webhook_receiver import WebhookReceiver
from tests.support.waiting import wait_for

PREFIX = "trace:"
PROMPT = "Refund $120 on order A103 because the floor is torn."
REJECTED_PROMPT = "Refund $75 on order A100 because the sole came off."
LIVE_PROMPT = "Refund $60 on order A106 because the zip broke."
START_S = 120.0  # a role imports the agent stack: far longer on a loaded machine
AUTH = {"authorization": f"Bearer {ADMIN}"}


def config(hook_url: str) -> str:
    return f"""
[queues.default]
channels = ["inbox", "webhook:ops"]
timeout_s = 600

[queues.triage]
channels = ["inbox"]
timeout_s = 600
escalate_to = "managers"

[queues.managers]
channels = ["inbox"]
timeout_s = 600

[webhooks.ops]
url = "{hook_url}"
secret = "{SECRET}"

[[rules]]
id = "pings-are-fine"
effect = "allow"
tool = "ping"

[agents.refunds]
path = "refunds_demo:agent"
deps = "refunds_demo:make_deps"
live_wait_s = 0  # the trace of a round resumed by its resume job, not continued in place

[agents.refunds_live]  # the worker's default live wait: the round goes on in the paused job
path = "refunds_demo:agent"
deps = "refunds_demo:make_deps"
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def fleet(
    redis_url: str, tmp_path: Path, hooks: WebhookReceiver, otlp_endpoint: str
) -> Iterator[str]:
    """api, notifier, worker (with its resumer) and sweeper as processes; yields the API's URL."""
    env = api_env(redis_url, tmp_path, config(hooks.url("/hook")))
    env.pop("APPROVAL_BROKER_DEMO_MODEL", None)
    env = {k: v for k, v in env.items() if not k.startswith("OTEL_")}
    env |= {
        "APPROVAL_BROKER_KEY_PREFIX": PREFIX,
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp_endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "100",  # export within a tenth of a second
        "OTEL_EXPORTER_OTLP_TIMEOUT": "2",
    }
    port = free_port()
    roles = {
        "api": ["api", "--port", str(port)],
        "notifier": ["notifier"],
        "worker": ["worker", "--concurrency", "4"],
        "sweeper": ["sweeper"],
    }
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for name, argv in roles.items():
            with (tmp_path / f"{name}.log").open("ab") as log:
                processes.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "approval_broker", *argv],
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: _healthy(url), timeout=START_S, interval=0.2)
        wait_for(lambda: "worker ready" in (tmp_path / "worker.log").read_text(), timeout=START_S)
        wait_for(lambda: "reading queues" in (tmp_path / "notifier.log").read_text(), timeout=START_S)  # fmt: skip
        yield url
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, 9)
                process.wait()


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def approve_a_run(url: str) -> str:
    """Start the refund run, approve its one request over the API, wait until it finished."""
    return decide_a_run(url, PROMPT, {"outcome": "approved"}, refunded=True)


def decide_a_run(
    url: str, prompt: str, decision: dict[str, str], *, refunded: bool, agent: str = "refunds"
) -> str:
    """Start a refund run, decide its one request over the API, wait until it finished."""
    with httpx.Client(base_url=url, headers=AUTH, timeout=10) as api:
        started = api.post("/v1/runs", json={"agent": agent, "prompt": prompt})
        assert started.status_code == 202, started.text
        run_id = started.json()["run_id"]

        def waiting() -> list[str] | None:
            run = api.get(f"/v1/runs/{run_id}").json()
            return run["pending"] if run["status"] == "waiting" else None

        [request_id] = wait_for(waiting, timeout=60)
        decided = api.post(f"/v1/requests/{request_id}/decision", json=decision)
        assert decided.status_code == 200, decided.text

        def finished() -> dict | None:
            run = api.get(f"/v1/runs/{run_id}").json()
            return run if run["status"] in ("finished", "failed") else None

        run = wait_for(finished, timeout=60)
        assert run["status"] == "finished", run
        assert run["output"]["refunded"] is refunded
    return run_id


def ask_and_let_time_out(url: str) -> str:
    """`POST /v1/requests` for one second; nobody answers; returns its id once timed out."""
    with httpx.Client(base_url=url, headers=AUTH, timeout=10) as api:
        made = api.post(
            "/v1/requests", json={"tool_name": "wire", "args": {"n": 1}, "timeout_s": 1}
        )
        assert made.status_code == 201, made.text
        request_id = made.json()["id"]
        wait_for(
            lambda: api.get(f"/v1/requests/{request_id}").json()["status"] == "timed_out",
            timeout=30,
        )
    return request_id


def ask_and_escalate(url: str) -> str:
    """`POST /v1/requests` in queue triage, then a person escalates it to its next queue."""
    with httpx.Client(base_url=url, headers=AUTH, timeout=10) as api:
        made = api.post("/v1/requests", json={"tool_name": "wire", "queue": "triage"})
        assert made.status_code == 201, made.text
        request_id = made.json()["id"]
        moved = api.post(
            f"/v1/requests/{request_id}/decision", json={"outcome": "escalated", "reason": "big"}
        )
        assert moved.status_code == 200 and moved.json()["queue"] == "managers", moved.text
    return request_id


def of_request(otlp: OtlpReceiver, request_id: str) -> list[Span]:
    """Every span of the trace(s) the request's spans are in."""
    spans = otlp.snapshot()
    traces = {s.trace_id for s in spans if s.attributes.get("approval.request.id") == request_id}
    return [s for s in spans if s.trace_id in traces]


def ask_what_a_rule_allows(url: str) -> str:
    """`POST /v1/requests` for a call a rule allows: decided as it is made."""
    with httpx.Client(base_url=url, headers=AUTH, timeout=10) as api:
        made = api.post("/v1/requests", json={"tool_name": "ping", "args": {}})
        assert made.status_code == 201, made.text
        assert made.json()["status"] == "approved"
        return str(made.json()["id"])


def decided_trace(otlp: OtlpReceiver, request_id: str) -> list[Span] | None:
    """The request's trace once its decision's span is in it."""
    spans = of_request(otlp, request_id)
    return spans if any(s.name == "approval.decision" for s in spans) else None


def timed_out_trace(otlp: OtlpReceiver, request_id: str) -> list[Span] | None:
    """The request's trace once the sweeper's time-out span is in it."""
    spans = of_request(otlp, request_id)
    return spans if any(s.name == "approval.timeout" for s in spans) else None


def trace_of(spans: list[Span], run_id: str) -> list[Span]:
    """Every span of the trace(s) in which the run's spans are: one, if all is well."""
    traces = {s.trace_id for s in spans if s.attributes.get("approval.run.id") == run_id}
    return [s for s in spans if s.trace_id in traces]


def complete(spans: list[Span]) -> bool:
    names = [s.name for s in spans]
    return (
        "POST /v1/runs" in names
        and names.count("process agent-runs") >= 2
        and "approval.decision" in names
        and any(s.name == "deliver webhook:ops" for s in spans)
        and sum(s.name == "deliver webhook:ops" for s in spans) >= 2  # requested and decided
        and sum(_ran_the_tool(s) for s in spans) >= 2  # deferred in round 0, ran in round 1
    )


def complete_live(spans: list[Span]) -> bool:
    """A run whose round went on in the job that paused it: one job, the tool ran in it."""
    names = [s.name for s in spans]
    return (
        "POST /v1/runs" in names
        and "process agent-runs" in names
        and "approval.decision" in names
        and sum(_ran_the_tool(s) for s in spans) >= 2
    )


def ancestors(span: Span, trace: list[Span]) -> list[Span]:
    """`span`'s parent, its parent's parent, ... up to the root, within `trace`."""
    by_id = {s.span_id: s for s in trace}
    out = []
    while span.parent_id:
        span = by_id[span.parent_id]
        out.append(span)
    return out


def _ran_the_tool(span: Span) -> bool:
    return (
        span.attributes.get("gen_ai.tool.name") == "issue_refund"
        and span.attributes.get("gen_ai.operation.name") == "execute_tool"
    )


def test_an_approved_run_is_one_connected_trace_across_api_notifier_and_worker(
    redis_url: str, tmp_path: Path
) -> None:
    otlp = OtlpReceiver().start()
    hooks = WebhookReceiver(SECRET).start()
    try:
        with fleet(redis_url, tmp_path, hooks, otlp.endpoint) as url:
            run_id = approve_a_run(url)
            live_id = decide_a_run(
                url, LIVE_PROMPT, {"outcome": "approved"}, refunded=True, agent="refunds_live"
            )
            rejection = {"outcome": "rejected", "reason": "Photo needed"}
            refused = decide_a_run(url, REJECTED_PROMPT, rejection, refunded=False)
            spans = wait_for(
                lambda: (t := trace_of(otlp.snapshot(), run_id)) and complete(t) and t,
                timeout=30,
            )
            live_spans = wait_for(
                lambda: (t := trace_of(otlp.snapshot(), live_id)) and complete_live(t) and t,
                timeout=30,
            )
            unanswered = ask_and_let_time_out(url)
            ruled = ask_what_a_rule_allows(url)
            escalated = ask_and_escalate(url)
            timed_out = wait_for(lambda: timed_out_trace(otlp, unanswered), timeout=30)
            moved = wait_for(
                lambda: (
                    [s for s in of_request(otlp, escalated) if s.name == "approval.escalation"]
                    and of_request(otlp, escalated)
                ),
                timeout=30,
            )
            by_rule = wait_for(lambda: decided_trace(otlp, ruled), timeout=30)
            refused_spans = wait_for(
                lambda: (
                    [s for s in trace_of(otlp.snapshot(), refused) if s.name == "approval.decision"]
                    or None
                ),
                timeout=30,
            )
    finally:
        otlp.stop()
        hooks.stop()

    # one trace: a single root (the API call), every other span's parent is a span of it
    ids = {s.span_id for s in spans}
    roots = [s for s in spans if not s.parent_id]
    assert [r.name for r in roots] == ["POST /v1/runs"]
    orphans = [s.name for s in spans if s.parent_id and s.parent_id not in ids]
    assert orphans == []
    services = {s.service for s in spans}
    assert {"approval-broker-api", "approval-broker-notifier", "approval-broker-worker"} <= services

    by_id = {s.span_id: s for s in spans}

    [decision] = [s for s in spans if s.name == "approval.decision"]
    assert decision.service == "approval-broker-api"
    assert decision.attributes["approval.outcome"] == "approved"
    assert decision.attributes["approval.decided_by.kind"] == "person"
    assert decision.attributes["approval.queue"] == "default"
    assert decision.attributes["gen_ai.tool.name"] == "issue_refund"
    assert decision.attributes["gen_ai.tool.call.id"]
    assert "process agent-runs" in [
        a.name for a in ancestors(decision, spans)
    ]  # the round that asked

    jobs = sorted(
        (s for s in spans if s.name == "process agent-runs"),
        key=lambda s: s.attributes["approval.round"],
    )
    assert [j.attributes["approval.round"] for j in jobs] == [0, 1]
    assert all(j.attributes["approval.run.id"] == run_id for j in jobs)
    # the API enqueues the resume of the round its decision completes (the resumer only
    # recovers an entry an API left behind)
    assert by_id[jobs[1].parent_id].name == "send agent-runs"
    assert by_id[jobs[1].parent_id].service == "approval-broker-api"

    ran = [s for s in spans if _ran_the_tool(s)]
    assert [s.service for s in ran] == ["approval-broker-worker"] * len(ran)
    assert any(jobs[1] in ancestors(s, spans) for s in ran)  # the tool ran in the resumed round

    # a round answered within the worker's live wait goes on in the job that paused it: one
    # trace still, the tool ran under that job (round 0's), and no resume job was sent
    live_ids = {s.span_id for s in live_spans}
    assert [s.name for s in live_spans if not s.parent_id] == ["POST /v1/runs"]
    assert [s.name for s in live_spans if s.parent_id and s.parent_id not in live_ids] == []
    [live_job] = [s for s in live_spans if s.name == "process agent-runs"]
    assert live_job.attributes["approval.round"] == 0
    assert sum(s.name == "send agent-runs" for s in live_spans) == 1  # the start's job only
    assert all(live_job in ancestors(s, live_spans) for s in live_spans if _ran_the_tool(s))

    # a rejected call leaves its span too, in its own run's trace
    [rejected] = refused_spans
    assert rejected.attributes["approval.outcome"] == "rejected"
    assert rejected.attributes["gen_ai.tool.name"] == "issue_refund"
    assert rejected.trace_id != spans[0].trace_id

    # a request made over HTTP is a trace of its own; the sweeper's time-out is in it
    [asked] = [s for s in timed_out if not s.parent_id]
    assert asked.name == "POST /v1/requests"
    assert len({s.trace_id for s in timed_out}) == 1
    [timeout] = [s for s in timed_out if s.name == "approval.timeout"]
    assert timeout.service == "approval-broker-sweeper"
    assert timeout.attributes["approval.decided_by.kind"] == "system"
    assert timeout.attributes["approval.outcome"] == "timed_out"
    assert any(s.name == "deliver webhook:ops" for s in timed_out)

    # a rule's decision at creation is in the trace of the call that made the request
    [made_by] = [s for s in by_rule if not s.parent_id]
    assert made_by.name == "POST /v1/requests"
    [ruling] = [s for s in by_rule if s.name == "approval.decision"]
    assert ruling.attributes["approval.decided_by.kind"] == "rule"
    assert ruling.attributes["approval.rule"] == "pings-are-fine"
    assert ruling.attributes["approval.outcome"] == "approved"

    # a person's escalation is in the trace of the call that made the request
    [made_there] = [s for s in moved if not s.parent_id]
    assert made_there.name == "POST /v1/requests"
    [escalation] = [s for s in moved if s.name == "approval.escalation"]
    assert escalation.service == "approval-broker-api"
    assert escalation.attributes["approval.decided_by.kind"] == "person"
    assert escalation.attributes["approval.queue"] == "triage"
    assert escalation.attributes["approval.queue.to"] == "managers"

    deliveries = [s for s in spans if s.name == "deliver webhook:ops"]
    assert {d.attributes["approval.event"] for d in deliveries} >= {
        "approval.requested",
        "approval.decided",
    }
    assert all(d.service == "approval-broker-notifier" for d in deliveries)
    # the webhook's receiver can go on with the trace: its traceparent names a delivery span
    carried = [
        h.headers.get("traceparent", "")
        for h in hooks.to("/hook")
        if h.payload["data"].get("run_id") == run_id
    ]
    assert carried and all(c.split("-")[1] == spans[0].trace_id for c in carried)
    assert {c.split("-")[2] for c in carried} <= {d.span_id for d in deliveries}


def test_with_the_collector_down_the_roles_keep_working_and_drop_their_spans(
    redis_url: str, tmp_path: Path
) -> None:
    hooks = WebhookReceiver(SECRET).start()
    nobody = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    try:
        with fleet(redis_url, tmp_path, hooks, nobody) as url:
            approve_a_run(url)
            # deliveries run on several threads: the decision's may land before the request's
            events = wait_for(
                lambda: (
                    (e := {d.payload["type"] for d in hooks.to("/hook")})
                    >= {"approval.requested", "approval.decided"}
                    and e
                ),
                timeout=30,
            )
    finally:
        hooks.stop()
    assert {"approval.requested", "approval.decided"} <= events
    assert all(d.headers.get("traceparent") for d in hooks.to("/hook"))
