"""Requests per second delivered to a local webhook receiver by 1 and by 3 notifier processes.

    uv run python bench/bench_notify.py [--requests 10000] [--procs 1,3]
    uv run python bench/bench_notify.py --transports [--posts 5000] [--in-flight 16]

Everything runs on this machine: an embedded Redis, a receiver that verifies every Standard
Webhooks signature (tests/support/fakes/webhook_receiver.py, its own process), and `approval-broker
notifier` processes. The backlog of requests is created first, with the notifiers' group
pointed past it; once every notifier is up, the group is rewound and the clock starts, so
start-up time is not counted. The clock stops when the receiver has accepted every request.

`--transports`: the outbound HTTP client alone, four ways side by side in one run, rounds
alternated: `--posts` signed webhook POSTs, `--in-flight` at once from one event loop in this
process, to the same receiver, with httpx's own async pool (`httpx.AsyncClient`), with httpx's
API on aiohttp's connections (`httpx_aiohttp.HttpxAiohttpClient`) on the stdlib's loop and on
uvloop's (what the notifier uses), and with aiohttp alone; this process's CPU per POST, the
least of `--rounds` rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import uvloop
from httpx_aiohttp import HttpxAiohttpClient
from redis import Redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from broker.domain.config import load_config  # noqa: E402
from broker.domain.models import NewRequest  # noqa: E402
from broker.facade import Broker  # noqa: E402
from broker.redis.embedded import EmbeddedRedis  # noqa: E402
from broker.store.keys import NOTIFIER_GROUP  # noqa: E402
from channels.webhook.sender import Signer, signature_headers  # noqa: E402
from tests.support.fakes.harness import SECRET  # noqa: E402

CLI = str(Path(sys.executable).parent / "approval-broker")


def start_receiver() -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.fakes.webhook_receiver",
            "--secret",
            SECRET,
            "--no-record",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline().strip()
    if not line.startswith("listening on "):
        raise SystemExit(f"receiver did not start: {line!r}")
    return process, line.removeprefix("listening on ")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process so far (Linux /proc)."""
    return sum(cpu_split(pid))


def cpu_split(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of one process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def profile(args: argparse.Namespace, pid: int) -> subprocess.Popen[bytes] | None:
    """py-spy on the first notifier for the measured phase (`--profile FILE`), or nothing."""
    if not args.profile:
        return None
    spy = [str(Path(sys.executable).parent / "py-spy"), "record", "--gil", "--format", "raw"]
    return subprocess.Popen(
        [*spy, "-r", "200", "-o", args.profile, "--pid", str(pid)], stdout=subprocess.DEVNULL
    )


def receiver_stats(url: str) -> dict[str, int]:
    with urllib.request.urlopen(f"{url}/stats", timeout=5) as response:
        return json.loads(response.read())


def write_config(directory: Path, receiver_url: str) -> Path:
    path = directory / "bench.toml"
    path.write_text(
        f"""
[queues.default]
channels = ["inbox", "webhook:bench"]

[webhooks.bench]
url = "{receiver_url}/hook"
secret = "{SECRET}"
max_attempts = 10
backoff_s = 0.05
max_backoff_s = 1.0
"""
    )
    return path


def run_once(
    redis_url: str,
    config_path: Path,
    receiver_url: str,
    procs: int,
    n: int,
    args: argparse.Namespace,
) -> dict[str, float]:
    prefix = f"bench{procs}:{os.getpid()}:"
    broker = Broker(Redis.from_url(redis_url), load_config(config_path), prefix=prefix)
    stream = broker.keys.stream("default")

    started = time.perf_counter()
    for i in range(n):
        broker.create_request(NewRequest(tool_name="refund", args={"order": i, "amount": 10}))
    create_rate = n / (time.perf_counter() - started)
    broker.redis.xgroup_create(stream, NOTIFIER_GROUP, id="$", mkstream=True)  # hide the backlog

    env = {
        **os.environ,
        "APPROVAL_BROKER_REDIS_URL": redis_url,
        "APPROVAL_BROKER_CONFIG": str(config_path),
        "APPROVAL_BROKER_KEY_PREFIX": prefix,
        "APPROVAL_BROKER_NOTIFIER_WORKERS": str(args.workers),
        "APPROVAL_BROKER_NOTIFIER_BATCH": str(args.batch),
    }
    spy: subprocess.Popen[bytes] | None = None
    fleet = [
        subprocess.Popen(
            [CLI, "notifier"],
            env={**env, "APPROVAL_BROKER_NOTIFIER_NAME": f"bench-{procs}-{k}"},
            stdout=subprocess.PIPE,
            text=True,
        )
        for k in range(procs)
    ]
    try:
        for process in fleet:
            assert process.stdout is not None
            line = process.stdout.readline()
            if "reading queues" not in line:
                raise SystemExit(f"notifier did not start: {line!r}")
        base = receiver_stats(receiver_url)["unique_ids"]
        spy = profile(args, fleet[0].pid)
        cpu0 = sum(cpu_s(p.pid) for p in fleet)
        sys0 = sum(cpu_split(p.pid)[1] for p in fleet)
        broker.redis.xgroup_setid(stream, NOTIFIER_GROUP, "0")  # the clock starts now
        t0 = time.perf_counter()
        delivered_at = None
        while True:
            got = receiver_stats(receiver_url)["unique_ids"] - base
            now = time.perf_counter()
            if delivered_at is None and got >= n:
                delivered_at = now
            if delivered_at is not None:
                if int(broker.redis.xpending(stream, NOTIFIER_GROUP)["pending"]) == 0:
                    acked_at = now
                    cpu = sum(cpu_s(p.pid) for p in fleet) - cpu0
                    system = sum(cpu_split(p.pid)[1] for p in fleet) - sys0
                    break
            if now - t0 > args.timeout:
                raise SystemExit(f"timed out: {got}/{n} delivered with {procs} notifier(s)")
            time.sleep(0.02)
    finally:
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(30)
        for process in fleet:
            process.send_signal(signal.SIGTERM)
        for process in fleet:
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
    stats = {k.decode(): int(v) for k, v in broker.redis.hgetall(broker.keys.stats).items()}
    broker.redis.close()
    return {
        "create_rate": create_rate,
        "seconds": delivered_at - t0,
        "rate": n / (delivered_at - t0),
        "acked_s": acked_at - t0,
        "cpu_ms": cpu * 1000 / n,
        "sys_ms": system * 1000 / n,
        "failed": stats.get("failed:webhook", 0),
        "delivered": stats.get("delivered:webhook", 0),
    }


async def _posts(post: Any, url: str, n: int, in_flight: int) -> None:
    """`n` signed POSTs to `url`, `in_flight` at a time, each answer read whole."""
    signer = Signer(SECRET)
    left = iter(range(n))

    async def lane() -> None:
        for i in left:
            body = json.dumps({"type": "approval.requested", "data": {"id": f"t{i}"}}).encode()
            headers = {"content-type": "application/json"}
            headers |= signature_headers(f"msg_t{i}_{time.monotonic_ns()}", body, [signer])
            await post(url, body, headers)

    await asyncio.gather(*(lane() for _ in range(in_flight)))


async def _one_round(kind: str, url: str, n: int, in_flight: int) -> float:
    """CPU µs per POST of this process for `n` POSTs with client `kind`."""
    limits = httpx.Limits(max_connections=in_flight, max_keepalive_connections=in_flight)
    if kind == "aiohttp alone":
        connector = aiohttp.TCPConnector(limit=in_flight)
        async with aiohttp.ClientSession(connector=connector) as session:

            async def post(u: str, body: bytes, headers: dict[str, str]) -> None:
                async with session.post(u, data=body, headers=headers) as response:
                    await response.read()
                    response.raise_for_status()

            await _posts(post, url, 50, in_flight)  # connect and warm up
            began = time.process_time()
            await _posts(post, url, n, in_flight)
            return (time.process_time() - began) / n * 1e6
    client_class = httpx.AsyncClient if kind == "httpx's own pool" else HttpxAiohttpClient
    async with client_class(limits=limits, timeout=10) as client:

        async def post(u: str, body: bytes, headers: dict[str, str]) -> None:
            async with client.stream("POST", u, content=body, headers=headers) as response:
                async for _ in response.aiter_raw():
                    pass
                response.raise_for_status()

        await _posts(post, url, 50, in_flight)
        began = time.process_time()
        await _posts(post, url, n, in_flight)
        return (time.process_time() - began) / n * 1e6


def compare_transports(args: argparse.Namespace) -> None:
    """`--transports`: the three clients, rounds alternated, against one receiver (the e2e
    bench's: Starlette on uvicorn, verifying each signature, answering 204, deciding nothing)."""
    receiver = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "webhook_receiver.py"), "--secret", SECRET,
         "--api", "http://127.0.0.1:9", "--mix", "ignore=1"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert receiver.stdout is not None
    line = receiver.stdout.readline().strip()
    if not line.startswith("listening on "):
        raise SystemExit(f"receiver did not start: {line!r}")
    receiver_url = line.removeprefix("listening on ")
    kinds = [
        "httpx's own pool",
        "httpx on aiohttp",
        "httpx on aiohttp, uvloop",  # what the notifier runs (channels.webhook.http)
        "aiohttp alone",
    ]
    seen: dict[str, list[float]] = {k: [] for k in kinds}
    try:
        for _ in range(args.rounds):
            for kind in kinds:
                factory = uvloop.new_event_loop if kind.endswith("uvloop") else None
                with asyncio.Runner(loop_factory=factory) as runner:
                    seen[kind].append(
                        runner.run(
                            _one_round(kind, f"{receiver_url}/hook", args.posts, args.in_flight)
                        )
                    )
    finally:
        receiver.send_signal(signal.SIGTERM)
        receiver.wait(10)
    print(
        f"{os.cpu_count()} CPUs; {args.posts} signed POSTs per round, {args.in_flight} in flight, "
        f"{args.rounds} rounds alternated; the client's CPU per POST (least, and all rounds)"
    )
    for kind in kinds:
        runs = ", ".join(f"{v:.0f}" for v in seen[kind])
        print(f"  {kind}: {min(seen[kind]):.0f} µs ({runs})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--procs", default="1,3", help="comma-separated process counts")
    parser.add_argument("--workers", type=int, default=8, help="delivery threads per channel")
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--profile", help="py-spy --gil raw profile of the first notifier here")
    parser.add_argument("--transports", action="store_true", help="compare the HTTP clients")
    parser.add_argument("--posts", type=int, default=5000, help="POSTs per round (--transports)")
    parser.add_argument("--in-flight", type=int, default=16, help="POSTs at once (--transports)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each (--transports)")
    args = parser.parse_args()
    if args.transports:
        compare_transports(args)
        return

    with tempfile.TemporaryDirectory(prefix="bench-notify-") as tmp:
        redis = EmbeddedRedis(Path(tmp) / "redis").start()
        receiver, receiver_url = start_receiver()
        try:
            config_path = write_config(Path(tmp), receiver_url)
            print(
                f"{os.cpu_count()} CPUs; {args.requests} requests per run; receiver verifies signatures"
            )
            for procs in (int(p) for p in args.procs.split(",")):
                r = run_once(redis.url, config_path, receiver_url, procs, args.requests, args)
                print(
                    f"{procs} notifier process(es): {args.requests} delivered in {r['seconds']:.2f} s"
                    f" = {r['rate']:,.0f} requests/s; notifier CPU {r['cpu_ms']:.3f} ms per delivery"
                    f" ({r['sys_ms']:.3f} of it system)"
                    f" (all acknowledged at {r['acked_s']:.2f} s;"
                    f" failed attempts {r['failed']}; backlog created at {r['create_rate']:,.0f}/s)",
                    flush=True,
                )
        finally:
            receiver.send_signal(signal.SIGTERM)
            receiver.wait(10)
            redis.close()


if __name__ == "__main__":
    main()
