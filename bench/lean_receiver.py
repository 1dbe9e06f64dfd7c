"""The benchmark's deciding webhook receiver on uvicorn (httptools, uvloop) instead of http.server.

Same behaviour as `tests.fakes.deciding_receiver` (it reuses its `DecidingReceiver` for
verifying every delivery with standardwebhooks, recording, and replying through the API on a
thread pool); only the HTTP around it is lean: a bare ASGI app in front, and one keep-alive
connection per replying thread behind (a pool shared by 16 threads spent half its time on its
lock), so what the e2e benchmark measures is the broker, not the fake.

    python bench/lean_receiver.py --secret whsec_... --api http://127.0.0.1:8001 [--api ...]
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import threading
from pathlib import Path
from typing import Any

import httpcore
import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.fakes.deciding_receiver import DecidingReceiver, mix_policy, parse_mix  # noqa: E402


class LeanReceiver(DecidingReceiver):
    """Replies over a keep-alive connection of each thread's own."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._local = threading.local()

    @property
    def _http(self) -> httpcore.ConnectionPool:  # type: ignore[override]
        pool = getattr(self._local, "pool", None)
        if pool is None:
            pool = self._local.pool = httpcore.ConnectionPool(max_connections=2)
        return pool

    @_http.setter
    def _http(self, value: httpcore.ConnectionPool) -> None:
        value.close()  # the shared one the base class makes: not used


def make_app(receiver: DecidingReceiver) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["method"] == "POST":
            chunks = []
            while True:
                message = await receive()
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    break
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
            status, body = receiver.receive(headers, b"".join(chunks)), b""
        elif scope["path"] == "/stats":
            status, body = 200, json.dumps(receiver.stats()).encode()
        elif scope["path"] == "/times":
            status, body = 200, json.dumps(receiver.times()).encode()
        else:
            status, body = 404, b"not found"
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--secret", required=True)
    parser.add_argument("--api", action="append", required=True, help="API base URL (repeat)")
    parser.add_argument("--endpoint", default="bench")
    parser.add_argument("--mix", default="approve=1")
    parser.add_argument("--threads", type=int, default=8)
    args = parser.parse_args()
    receiver = LeanReceiver(
        args.secret,
        args.api,
        endpoint=args.endpoint,
        policy=mix_policy(parse_mix(args.mix)),
        threads=args.threads,
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(2048)
    config = uvicorn.Config(
        make_app(receiver),
        loop="uvloop",
        http="httptools",
        log_level="warning",
        access_log=False,
        lifespan="off",
    )
    print(f"listening on http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        receiver.stop()


if __name__ == "__main__":
    main()
