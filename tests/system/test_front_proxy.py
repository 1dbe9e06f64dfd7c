"""The shipped front (`deploy/nginx/approval-broker.conf.template`, as `deploy/compose.yaml`
runs it) closes what the API's uvicorn can't, and lets everything else through unchanged.

Debian's nginx runs the template in front of a real `approval-broker api` process:

- 50 connections that send half a request line and 50 that send nothing are all closed by the
  front within its 5 s header deadline (plus a margin), and it goes on serving (uvicorn alone
  keeps such connections open: `tests/integration/test_api_idle_connections.py`);
- through the front, a request is created, long-polled (`?wait=`: held open for the wait),
  decided, and its events arrive on `/v1/events` as they happen (the stream is not held in a
  buffer); a body over the API's 1 MiB gets the API's 413 `{"error", "detail"}`, and one over
  the front's 2 MiB the same shape from the front.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from broker.redis.embedded import EmbeddedRedis
from tests.support.api_process import ADMIN, api_env, start_api, stop
from tests.support.debian import debian_program
from tests.support.front_proxy import nginx_front
from tests.support.idle_sockets import closed_by_server, connect
from tests.support.sse import events_of, next_event

HEADER_DEADLINE_S = 5.0  # the template's client_header_timeout
MARGIN_S = 3.0
STALLED = 50
AUTH = {"Authorization": f"Bearer {ADMIN}"}
CONFIG = '[queues.default]\nchannels = ["inbox"]\ntimeout_s = 600\n'


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """nginx with the shipped template, in front of an API process on a Redis of their own."""
    nginx = debian_program("nginx", "nginx")
    folder = tmp_path_factory.mktemp("front")
    with EmbeddedRedis(folder / "redis", unix_socket=False) as redis:
        proc, api_url = start_api(api_env(redis.url_for(0), folder, CONFIG))
        try:
            with nginx_front(nginx, api_url, folder / "nginx") as url:
                yield url
        finally:
            stop(proc)


def address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def test_the_front_closes_connections_that_never_complete_a_request_within_its_deadline(
    front: str,
) -> None:
    stalled = [connect(address(front), b"GET /healthz HT") for _ in range(STALLED)]
    stalled += [connect(address(front), b"") for _ in range(STALLED)]
    started = time.monotonic()
    try:
        assert closed_by_server(stalled, HEADER_DEADLINE_S + MARGIN_S) == len(stalled)
        assert time.monotonic() - started >= HEADER_DEADLINE_S - 1  # the deadline, not an error
        with httpx.Client(base_url=front, timeout=10) as http:  # and it still serves
            assert http.get("/healthz").status_code == 200
    finally:
        for sock in stalled:
            sock.close()


def test_requests_long_polls_and_event_streams_pass_through_the_front_unbuffered(
    front: str,
) -> None:
    with httpx.Client(base_url=front, headers=AUTH, timeout=30) as http:
        with http.stream("GET", "/v1/events") as stream:
            assert stream.status_code == 200
            reader = events_of(stream.iter_lines())
            assert next(reader).comment == "connected"  # sent at once, not held in a buffer
            made = http.post("/v1/requests", json={"tool_name": "refund", "args": {"n": 1}})
            assert made.status_code == 201, made.text
            request_id = made.json()["id"]
            seen = next_event(reader, within=5)
            assert (seen.event, seen.data["id"]) == ("approval.requested", request_id)

            started = time.monotonic()  # a long-poll with nothing to tell: held, then pending
            polled = http.get(f"/v1/requests/{request_id}", params={"wait": 2})
            assert polled.json()["status"] == "pending"
            assert time.monotonic() - started >= 1.5, "the front held the long-poll open"
            decided = http.post(f"/v1/requests/{request_id}/decision", json={"outcome": "approved"})
            assert decided.status_code == 200, decided.text
            polled = http.get(f"/v1/requests/{request_id}", params={"wait": 2})
            assert polled.json()["status"] == "approved"
            seen = next_event(reader, within=5)
            assert (seen.event, seen.data["id"]) == ("approval.decided", request_id)


@pytest.mark.parametrize(("size", "detail"), [(1_500_000, "1048576"), (3_000_000, "2 MiB")])
def test_a_body_too_large_gets_a_json_413_from_the_api_or_the_front(
    front: str, size: int, detail: str
) -> None:
    with httpx.Client(base_url=front, headers=AUTH, timeout=30) as http:
        big = http.post(
            "/v1/requests",
            content=b'{"tool_name": "x", "args": {"pad": "' + b"a" * size + b'"}}',
            headers={"Content-Type": "application/json"},
        )
    assert big.status_code == 413
    body = big.json()
    assert body["error"] == "too_large" and detail in body["detail"]
