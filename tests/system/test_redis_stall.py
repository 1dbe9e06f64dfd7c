"""A Redis that stalls costs the API bounded 503s, never a frozen process, and nothing half-written.

A real Redis of the test's own is paused (SIGSTOP: it accepts connections, answers nothing)
under a real `approval-broker api` process, then resumed (SIGCONT):

- paused: `/healthz` answers 503 within 2 s, even while a create waits on Redis in a thread;
  a create, a decision and a run read (on the asyncio client) answer 503 within 5 s;
- resumed: everything answers 200/201 again without a restart, and every request stored is
  whole: each one listed reads back, and the pending listing agrees with each request's status.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from broker.redis.embedded import EmbeddedRedis
from tests.support.api_process import ADMIN, api_env, start_api, stop

HEALTH_LIMIT_S = 2.0
WRITE_LIMIT_S = 5.0
AUTH = {"Authorization": f"Bearer {ADMIN}"}
CONFIG = '[queues.default]\nchannels = ["inbox"]\ntimeout_s = 600\n'


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    """A Redis of this test's own: pausing the session's would stall every other test's."""
    server = EmbeddedRedis(tmp_path / "redis", unix_socket=False).start()
    try:
        yield server
    finally:
        assert server.process is not None
        os.kill(server.process.pid, signal.SIGCONT)  # never leave it stopped
        server.close()


def timed(call: httpx.Client, method: str, path: str, **kw: object) -> tuple[int, float]:
    started = time.monotonic()
    response = call.request(method, path, **kw)  # type: ignore[arg-type]
    return response.status_code, time.monotonic() - started


def create(http: httpx.Client, n: int) -> str:
    made = http.post("/v1/requests", json={"tool_name": "refund", "args": {"n": n}})
    assert made.status_code == 201, made.text
    return str(made.json()["id"])


def decide(http: httpx.Client, request_id: str) -> httpx.Response:
    return http.post(f"/v1/requests/{request_id}/decision", json={"outcome": "approved"})


def until_ok(http: httpx.Client, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if http.get("/healthz").status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError("the API did not answer 200 on /healthz after Redis resumed")


def test_a_paused_redis_gives_bounded_503s_and_the_api_recovers_when_it_resumes(
    own_redis: EmbeddedRedis, tmp_path: Path
) -> None:
    proc, url = start_api(api_env(own_redis.url_for(0), tmp_path, CONFIG))
    assert own_redis.process is not None
    redis_pid = own_redis.process.pid
    try:
        with httpx.Client(base_url=url, headers=AUTH, timeout=30) as http:
            assert http.get("/healthz").status_code == 200
            stalled_decision = create(http, 1)
            later_decision = create(http, 2)

            os.kill(redis_pid, signal.SIGSTOP)
            try:
                created: list[tuple[int, float]] = []
                in_flight = threading.Thread(
                    target=lambda: created.append(
                        timed(http, "POST", "/v1/requests", json={"tool_name": "refund"})
                    )
                )
                in_flight.start()
                health = timed(http, "GET", "/healthz")  # while the create waits on Redis
                in_flight.join(30)
                decision = timed(http, "POST", f"/v1/requests/{stalled_decision}/decision",
                                 json={"outcome": "approved"})  # fmt: skip
                run_read = timed(http, "GET", "/v1/runs/run_stalled", params={"wait": 1})
                health_after = timed(http, "GET", "/healthz")
            finally:
                os.kill(redis_pid, signal.SIGCONT)

            print(
                f"paused: healthz {health}, create {created}, decision {decision}, run {run_read}"
            )
            assert health[0] == 503 and health[1] <= HEALTH_LIMIT_S, health
            assert created and created[0][0] == 503, created
            assert created[0][1] <= WRITE_LIMIT_S, created
            assert decision[0] == 503 and decision[1] <= WRITE_LIMIT_S, decision
            assert run_read[0] == 503 and run_read[1] <= WRITE_LIMIT_S, run_read  # asyncio reads
            assert health_after[0] == 503 and health_after[1] <= HEALTH_LIMIT_S, health_after

            until_ok(http)
            create(http, 3)
            assert decide(http, later_decision).status_code == 200
            again = decide(http, stalled_decision)  # the stalled one may have landed on resume
            assert again.status_code in (200, 409), again.text
            assert http.get(f"/v1/requests/{stalled_decision}").json()["status"] == "approved"

            listed = http.get("/v1/requests", params={"limit": 1000})
            assert listed.status_code == 200
            pending = {
                r["id"] for r in http.get("/v1/requests", params={"status": "pending"}).json()
            }
            for item in listed.json():
                one = http.get(f"/v1/requests/{item['id']}")
                assert one.status_code == 200, one.text
                assert (one.json()["status"] == "pending") == (item["id"] in pending), one.json()
    finally:
        stop(proc)
