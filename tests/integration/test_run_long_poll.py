"""`GET /v1/runs/{id}?wait=S` over real HTTP: it answers when the run needs a person (waiting
with pending requests) or has ended, woken by the run-events stream, not by a timer.

Each runs on a single Redis and on the local Redis Cluster (the run-events stream of every
partition is followed). The agent runs in this process (RQ's SimpleWorker, burst), started
only once the long-poll is parked, so the answer can only come from the announcement."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from api.app import create_app
from api.testing import ServerThread
from broker.domain.config import Config, parse_config
from broker.domain.models import Decision
from broker.domain.principals import hash_token
from broker.domain.settings import Settings
from broker.facade import Broker
from broker.runs.agents import register_agent
from broker.runs.starting import start_run
from tests.support.backends import on_backend, resume_once  # noqa: F401 - `redis` on both backends
from tests.support.cluster_reads import blocked_reads
from tests.support.jobs import jobs_bound_to, work
from tests.support.waiting import wait_for

ADMIN = "tok-admin-long-poll-0123456789"
SEES = "tok-starter-long-poll-0123456789"
OTHER = "tok-other-long-poll-0123456789"
DEMO = "refunds_demo:agent"
PROMPT = "Refund $120 on order A103 because the floor is torn."


@pytest.fixture
def cfg() -> Config:
    return parse_config(
        {
            "queues": {"default": {"channels": ["inbox"], "timeout_s": 600}},
            "approvers": {
                "svc": {"token_sha256": hash_token(SEES), "roles": ["requester"]},
                "eve": {"token_sha256": hash_token(OTHER), "roles": ["requester"]},
            },
        }
    )


@pytest.fixture
def api_broker(make_broker_on: Callable[..., Broker], cfg: Config) -> Iterator[Broker]:
    """On a single Redis or the local cluster (RQ then on a single Redis beside it)."""
    broker = make_broker_on(cfg)
    register_agent(broker, "refunds", DEMO, deps="refunds_demo:make_deps", max_rounds=3)
    with jobs_bound_to(broker):
        yield broker


@pytest.fixture
def app(cfg: Config, api_broker: Broker) -> FastAPI:
    return create_app(Settings(admin_token=ADMIN), cfg, api_broker)


@pytest.fixture
def http(app: FastAPI) -> Iterator[httpx.Client]:
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


def as_(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def parked(app: FastAPI, broker: Broker) -> bool:
    """One run is waited on and the reader blocks on every partition: whatever the run does
    now must reach the long-poll through the streams."""
    waiter = getattr(app.state, "waiter", None)
    watched = len(waiter._watchers) if waiter is not None else 0
    return watched == 1 and blocked_reads(broker) == broker.keys.partitions


def long_poll(http: httpx.Client, run_id: str, wait: float = 30) -> tuple[threading.Thread, list]:
    out: list[Any] = []

    def get() -> None:
        began = time.monotonic()
        resp = http.get(f"/v1/runs/{run_id}", params={"wait": wait}, headers=as_(SEES))
        out.append((resp, time.monotonic() - began))

    thread = threading.Thread(target=get, daemon=True)
    thread.start()
    return thread, out


def answered(thread: threading.Thread, out: list, step: Callable[[], None]) -> tuple[Any, float]:
    """`step()` once the long-poll is parked; then its answer and how long it took."""
    step()
    thread.join(20)
    assert not thread.is_alive(), "the long-poll did not answer"
    resp, took = out[0]
    assert resp.status_code == 200, resp.text
    return resp.json(), took


def test_a_run_long_poll_answers_when_the_run_pauses_and_again_when_it_finishes(
    app: FastAPI, api_broker: Broker, http: httpx.Client
) -> None:
    started = http.post("/v1/runs", json={"agent": "refunds", "prompt": PROMPT}, headers=as_(SEES))
    assert started.status_code == 202, started.text
    run_id = started.json()["run_id"]

    thread, out = long_poll(http, run_id)
    wait_for(lambda: parked(app, api_broker))
    run, took = answered(thread, out, lambda: work(api_broker))
    assert run["status"] == "waiting" and len(run["pending"]) == 1
    assert took < 20

    api_broker.decide(run["pending"][0], Decision(outcome="approved"), decided_by="bob")
    # answered but not resumed yet: the run still says `waiting`, with nothing pending; a
    # long-poll now waits for the run to finish instead of answering at once
    assert api_broker.get_run(run_id).pending == []
    thread, out = long_poll(http, run_id)
    wait_for(lambda: parked(app, api_broker))

    def resume_and_run() -> None:
        assert [h.action for h in resume_once(api_broker)] == ["enqueued"]
        work(api_broker)

    run, took = answered(thread, out, resume_and_run)
    assert run["status"] == "finished", run
    assert took < 20


def test_a_run_long_poll_answers_at_once_when_the_run_is_settled_or_after_its_wait(
    api_broker: Broker, http: httpx.Client
) -> None:
    queued = start_run(api_broker, "refunds", PROMPT, started_by="svc")
    began = time.monotonic()
    resp = http.get(f"/v1/runs/{queued.id}", params={"wait": 0.5}, headers=as_(SEES))
    assert resp.status_code == 200 and resp.json()["status"] == "queued"
    assert time.monotonic() - began >= 0.5  # nothing happened: answered as it stands

    work(api_broker)  # now waiting for a person: settled
    began = time.monotonic()
    resp = http.get(f"/v1/runs/{queued.id}", params={"wait": 30}, headers=as_(SEES))
    assert resp.json()["status"] == "waiting"
    assert time.monotonic() - began < 5


def test_a_run_long_poll_is_404_at_once_for_whoever_may_not_see_the_run_and_422_past_60_s(
    api_broker: Broker, http: httpx.Client
) -> None:
    run = start_run(api_broker, "refunds", PROMPT, started_by="svc")
    began = time.monotonic()
    hidden = http.get(f"/v1/runs/{run.id}", params={"wait": 30}, headers=as_(OTHER))
    assert hidden.status_code == 404 and hidden.json()["error"] == "not_found"
    missing = http.get("/v1/runs/run_nope", params={"wait": 30}, headers=as_(SEES))
    assert missing.status_code == 404
    assert time.monotonic() - began < 5
    for bad in ("61", "0", "-1", "soon"):
        resp = http.get(f"/v1/runs/{run.id}", params={"wait": bad}, headers=as_(SEES))
        assert resp.status_code == 422, (bad, resp.text)
        assert set(resp.json()) >= {"error", "detail"}
