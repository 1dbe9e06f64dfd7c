"""After a crash the API's port is free to use again at once (SO_REUSEADDR, as uvicorn binds).

A real `approval-broker api` with a client connection open is killed (SIGKILL); the port's old
connection lingers in the kernel (FIN_WAIT/TIME_WAIT), no socket listens. `up`'s port check
passes and a new `api` starts on that same port at once, where a plain bind would be refused
for about a minute.
"""

from __future__ import annotations

import signal
import socket
from pathlib import Path

import httpx
import pytest

from approval_broker.up import check_port_free
from broker.redis.embedded import free_port
from tests.support.api_process import api_env, start_api, stop


def lingering(port: int) -> bool:
    """A plain bind (no SO_REUSEADDR) is refused: the old connection is still in the kernel."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def drain(client: socket.socket) -> None:
    """Read to the killed server's FIN, so the client's close is a FIN (TIME_WAIT), not a RST."""
    while client.recv(65536):
        pass


@pytest.mark.timeout(600)  # two API process starts: minutes each beside the fleet test's processes
def test_the_api_and_ups_port_check_start_at_once_on_the_port_of_a_killed_api(
    redis_url: str, tmp_path: Path
) -> None:
    port = free_port()
    env = api_env(redis_url, tmp_path)
    first, url = start_api(env, port)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
            client.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert client.recv(65536).startswith(b"HTTP/1.1 200")
            first.send_signal(signal.SIGKILL)
            first.wait(10)
            drain(client)  # unread bytes would make close() send a RST, which ends TIME_WAIT
            assert lingering(port), "no connection left behind: the test would prove nothing"
            check_port_free("127.0.0.1", port)  # `up` would start (FIN_WAIT on the port)
        assert lingering(port), "no connection left behind: the test would prove nothing"
        check_port_free("127.0.0.1", port)  # and again once the client closed (TIME_WAIT)
        second, again = start_api(env, port)
        try:
            assert again == url
            assert httpx.get(f"{again}/healthz", timeout=10).status_code == 200
        finally:
            stop(second)
    finally:
        stop(first)
