"""Benchmark the reply API: decisions/s over HTTP, and decision -> resume job enqueued latency.

Starts an embedded Redis, `approval-broker api` and `approval-broker resumer` as subprocesses,
registers one-request rounds of many runs, then decides them over HTTP:

1. at a steady rate (default 100/s), measuring for each decision the time from the client
   sending it to the resume job being enqueued on RQ by the resumer (RQ's `enqueued_at`), and
   the HTTP round trip;
2. as fast as the clients can, reporting decisions/s, the API process's CPU per decision and
   the Redis round trips per decision (all clients, as Redis counts them), and Redis's CPU.

The clients are separate processes (default 2) so they don't share the API's loop, each an
`aiohttp.ClientSession` (`--client httpx`: an `httpx.AsyncClient`) per API with a few
kept-alive connections, requests prepared beforehand.
`--profile FILE` records the API process with py-spy (`--gil`) during the fast phase.

Usage: uv run python bench/bench_api.py [--rate 100] [--seconds 10] [--burst 2000]
       [--processes 2] [--connections 32] [--apis 2] [--webhook] [--profile api.svg]

`--apis N` starts N API processes (the API holds no state) and spreads the clients'
connections over them; `--webhook` sends signed webhook replies in the fast phase instead of
REST decisions (what bench_e2e's receiver sends).

3. The framework's ceiling (`--no-bare` skips it): the same fast phase, same clients and
   requests, against `bench/bare_decide.py`, a FastAPI route of the decide route's shape (path
   and body validation, a bearer-token check, a JSON answer) on the same stock uvicorn, with no
   broker behind it. Its CPU per request is the floor under the API's; the rest is the broker's.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import aiohttp
import httpx
from benchlib import (
    bench_site,
    cpu_seconds,
    enqueued_at,
    make_rounds,
    pct,
    redis_round_trips,
    start_api,
    start_role,
    stop_roles,
)
from redis import Redis
from standardwebhooks import Webhook

from broker.domain.principals import hash_token
from broker.redis.embedded import free_port
from broker.runs.starting import resume_job_id

TOKEN = "bench-token"
SECRET = "whsec_" + base64.b64encode(b"bench-api-webhook-secret-0123456").decode()
CONFIG = f"""
[queues.default]
channels = ["inbox", "webhook:bench"]
timeout_s = 3600

[approvers.bench]
token_sha256 = "{hash_token(TOKEN)}"
roles = ["finance"]

[webhooks.bench]
url = "http://127.0.0.1:9/unused"
secret = "{SECRET}"
roles = ["ops"]
"""
BODY = b'{"outcome":"approved"}'
APIS = 1
"""API processes by default (`--apis`): one. On these two cores, with the clients and Redis on
them too, a second process cost more CPU per decision than it gained (quiet machine, 17:06:
1 API 3,209 / 2,774 decisions/s at 0.23 / 0.25 ms each, 2 APIs 2,838 / 2,717 at 0.31 ms; README
"Benchmarks"). bench_e2e runs two, where the receiver's replies come in from one loop."""
CONNECTIONS = 32
"""Keep-alive connections in all in the fast phase (`--connections`), so that it measures what
the machine can carry rather than how long a decision takes: with 8 (the earlier default) the
two cores sat partly idle (the `busy` line below) and the API read one or two requests per
loop turn; 32 keep them busy and let the API batch its Redis calls (README "Benchmarks": 8
and 32 connections, alternating runs)."""

Result = tuple[str, float, float, int]  # request id, wall time sent, HTTP round trip, status


Prepared = tuple[int, str, str, dict[str, str], bytes]  # index, request id, path, headers, body


def prepare(request_id: str, webhook: bool = False) -> tuple[str, dict[str, str], bytes]:
    """A REST decision, or (`webhook`) a reply signed as bench/webhook_receiver.py signs one:
    (path, headers, body)."""
    if not webhook:
        headers = {"authorization": f"Bearer {TOKEN}", "content-type": "application/json"}
        return f"/v1/requests/{request_id}/decision", headers, BODY
    body = json.dumps({"request_id": request_id, "outcome": "approved", "decided_by": "bot"})
    msg_id, now = f"msg_reply_{request_id}", datetime.now(UTC)
    headers = {
        "content-type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": Webhook(SECRET).sign(msg_id, now, body),
    }
    return "/v1/webhooks/bench/replies", headers, body.encode()


Post = Callable[[str, dict[str, str], bytes], Awaitable[tuple[int, str]]]
"""Send one POST on a kept-alive connection: (status, body text)."""


async def _connection(
    post: Post, jobs: list[Prepared], start: float, rate: float | None
) -> list[Result]:
    """One client connection's share of the decisions, sent in turn (paced when `rate`)."""
    out: list[Result] = []
    for i, request_id, path, headers, body in jobs:
        if rate:
            delay = start + i / rate - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
        wall, t0 = time.time(), time.perf_counter()
        status, text = await post(path, headers, body)
        out.append((request_id, wall, time.perf_counter() - t0, status))
        if status != 200:
            raise SystemExit(f"decision failed: {status} {text[:200]!r}")
    return out


@asynccontextmanager
async def posters(kind: str, urls: list[str], per_url: int) -> AsyncIterator[list[Post]]:
    """One POST function per API URL, each over `per_url` kept-alive connections, connected
    before it is yielded: `httpx.AsyncClient`, or `aiohttp.ClientSession` (the default: about a
    third of httpx's CPU per request, which matters when the clients share the API's cores)."""
    if kind == "httpx":
        limits = httpx.Limits(max_connections=per_url, max_keepalive_connections=per_url)
        clients = [
            httpx.AsyncClient(base_url=url, limits=limits, timeout=60.0, trust_env=False)
            for url in urls
        ]

        def httpx_post(client: httpx.AsyncClient) -> Post:
            async def post(path: str, headers: dict[str, str], body: bytes) -> tuple[int, str]:
                response = await client.post(path, headers=headers, content=body)
                return response.status_code, response.text if response.status_code != 200 else ""

            return post

        try:
            for client in clients:
                await asyncio.gather(*(client.get("/healthz") for _ in range(per_url)))
            yield [httpx_post(client) for client in clients]
        finally:
            for client in clients:
                await client.aclose()
        return
    timeout = aiohttp.ClientTimeout(total=60.0)
    sessions = [
        aiohttp.ClientSession(
            base_url=url, connector=aiohttp.TCPConnector(limit=per_url), timeout=timeout
        )
        for url in urls
    ]

    def aiohttp_post(session: aiohttp.ClientSession) -> Post:
        async def post(path: str, headers: dict[str, str], body: bytes) -> tuple[int, str]:
            async with session.post(path, headers=headers, data=body) as response:
                text = await response.text()
                return response.status, text

        return post

    async def health(session: aiohttp.ClientSession) -> None:
        async with session.get("/healthz") as response:
            await response.read()

    try:
        for session in sessions:
            await asyncio.gather(*(health(session) for _ in range(per_url)))
        yield [aiohttp_post(session) for session in sessions]
    finally:
        for session in sessions:
            await session.close()


def client_process(
    urls: list[str],
    jobs: list[tuple[int, str]],
    connections: int,
    rate: float | None,
    webhook: bool,
    kind: str,
    ready: Any,
    go: Any,
    start: Any,
    results: Any,
) -> None:
    """A client process: builds its requests' bytes, connects `connections` connections (in
    turn to each of `urls`), waits at `ready` for the others and for `go`, then they share
    `jobs` from wall time `start`; puts (its results, the wall time the last one came back, its
    CPU seconds meanwhile) on `results`."""

    async def run() -> list[Result]:
        shares = [jobs[c::connections] for c in range(connections)]
        shares = [share for share in shares if share]
        per_url = -(-len(shares) // len(urls))  # connections per API, rounded up
        prepared = [[(i, rid, *prepare(rid, webhook)) for i, rid in share] for share in shares]
        async with posters(kind, urls, per_url) as posts:  # connected before the clock starts
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, ready.wait)
            await loop.run_in_executor(None, go.wait)
            begin = start.value
            await asyncio.sleep(max(0.0, begin - time.time()))
            cpu0[0] = time.process_time()
            done = await asyncio.gather(
                *(
                    _connection(posts[c % len(posts)], share, begin, rate)
                    for c, share in enumerate(prepared)
                )
            )
        return [r for results in done for r in results]

    cpu0 = [0.0]
    try:
        out = asyncio.run(run())
    except BaseException as exc:  # the parent waits on `results`: tell it, don't leave it hanging
        results.put((None, f"{type(exc).__name__}: {exc}", 0.0))
        raise
    results.put((out, time.time(), time.process_time() - cpu0[0]))


def decide_all(
    urls: list[str],
    ids: list[str],
    processes: int,
    connections: int,
    rate: float | None,
    webhook: bool = False,
    kind: str = "aiohttp",
) -> tuple[list[Result], float, float]:
    """POST an approval (or a signed webhook reply) for every id from `processes` client
    processes, their connections spread over the APIs at `urls` (`rate`: paced, else as fast as
    they go); returns the results, the elapsed wall time from the moment every process was
    connected and waiting, and the clients' CPU seconds."""
    jobs = list(enumerate(ids))
    ctx = multiprocessing.get_context("spawn")
    ready, go = ctx.Barrier(processes + 1), ctx.Event()
    start, results = ctx.Value("d", 0.0), ctx.Queue()
    per = max(1, connections // processes)
    procs = [
        ctx.Process(
            target=client_process,
            args=(
                urls[p % len(urls) :] + urls[: p % len(urls)],
                jobs[p::processes],
                per,
                rate,
                webhook,
                kind,
                ready,
                go,
                start,
                results,
            ),
        )
        for p in range(processes)
    ]
    for proc in procs:
        proc.start()
    ready.wait(120)  # every process started (spawning takes a while) and connected
    start.value = time.time() + 0.05  # the clock starts now, not while the processes spawn
    go.set()
    answers = [results.get(timeout=600) for _ in procs]
    for part, error, _ in answers:
        if part is None:
            raise SystemExit(f"a client process failed: {error}")
    for proc in procs:
        proc.join(30)
        if proc.exitcode != 0:
            raise SystemExit(f"a client process failed (exit code {proc.exitcode})")
    out = [r for part, _, _ in answers for r in part]
    elapsed = max(end for _, end, _ in answers) - start.value
    return out, elapsed, sum(cpu for _, _, cpu in answers)


def redis_cpu(redis: Redis) -> float:
    info = redis.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def steady(urls: list[str], redis: Redis, ids: list[str], rate: float, kind: str) -> None:
    results, elapsed, _ = decide_all(urls, ids, 1, 4, rate, kind=kind)
    sent = {rid: wall for rid, wall, _, _ in results}
    jobs = {rid: resume_job_id(rid.split(".")[0], 1) for rid in ids}
    at = enqueued_at(redis, list(jobs.values()))
    lat = [(at[jobs[rid]] - sent[rid]) * 1000 for rid in ids]
    print(f"steady phase: {len(ids)} decisions at {len(ids) / elapsed:.0f}/s over HTTP"
          f" (target {rate:.0f}/s)")  # fmt: skip
    print(
        "  decision sent -> resume job enqueued (resumer, RQ enqueued_at): "
        f"p50 {pct(lat, 0.5):.1f} ms, p99 {pct(lat, 0.99):.1f} ms, max {max(lat):.1f} ms"
    )
    rtt_ms = [r[2] * 1000 for r in results]
    print(
        f"  HTTP round trip of a decision: p50 {pct(rtt_ms, 0.5):.1f} ms, "
        f"p99 {pct(rtt_ms, 0.99):.1f} ms, mean {statistics.fmean(rtt_ms):.1f} ms"
    )
    print(f"  target p99 < 10 ms at 100/s: {'met' if pct(lat, 0.99) < 10 else 'NOT met'}")


def burst(
    urls: list[str], redis: Redis, apis: list[subprocess.Popen[str]],
    ids: list[str], opts: argparse.Namespace, resumer: subprocess.Popen[str],
) -> None:  # fmt: skip
    profiler = None
    if opts.profile:
        profiler = subprocess.Popen(
            ["py-spy", "record", "--gil", "--pid", str(apis[0].pid), "--rate", "200",
             "--output", opts.profile, "--format", opts.profile_format],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        time.sleep(1.0)
    pids = [api.pid for api in apis]
    cpu0 = [cpu_seconds(pid) for pid in pids]
    resumer0 = cpu_seconds(resumer.pid)
    trips0, redis0 = redis_round_trips(redis), redis_cpu(redis)
    results, elapsed, client_s = decide_all(
        urls, ids, opts.processes, opts.connections, None, opts.webhook, opts.client
    )
    cpus = [cpu_seconds(pid) - c for pid, c in zip(pids, cpu0, strict=True)]
    trips = redis_round_trips(redis) - trips0 - 1  # less the INFO that read trips0
    redis_s = redis_cpu(redis) - redis0
    resumer_s = cpu_seconds(resumer.pid) - resumer0
    if profiler is not None:
        profiler.send_signal(2)  # SIGINT: py-spy writes its output and exits
        profiler.wait(30)
    n, cpu = len(ids), sum(cpus)
    rtt_ms = [r[2] * 1000 for r in results]
    what = "signed webhook replies" if opts.webhook else "decisions"
    print(
        f"fast phase: {n} {what}, {len(apis)} API process(es), {opts.processes} client"
        f" processes x {max(1, opts.connections // opts.processes)} keep-alive connections,"
        f" {elapsed:.2f} s: {n / elapsed:.0f} decisions/s (HTTP p50 {pct(rtt_ms, 0.5):.1f} ms,"
        f" p99 {pct(rtt_ms, 0.99):.1f} ms)"
    )
    if cpu:
        each = " + ".join(f"{c / n * 1000:.3f}" for c in cpus)
        print(f"  API process CPU per decision: {cpu / n * 1000:.3f} ms ({each} by process;"
              f" one core's worth: {n / cpu:.0f} decisions/s)")  # fmt: skip
    print(f"  Redis round trips per decision (API and resumer): {trips / n:.2f}")
    print(f"  client processes' CPU per decision: {client_s / n * 1000:.3f} ms")
    print(f"  Redis CPU per decision: {redis_s / n * 1000:.3f} ms (the whole fleet's)")
    print(f"  resumer CPU per decision: {resumer_s / n * 1000:.3f} ms")
    used = cpu + resumer_s + redis_s + client_s
    print(
        f"  busy: {used / (elapsed * (os.cpu_count() or 1)):.0%} of the machine's"
        f" {os.cpu_count()} CPUs (API, resumer, Redis and clients: {used / n * 1000:.3f} ms"
        " per decision)"
    )


def start_bare() -> tuple[subprocess.Popen[str], str]:
    """bench/bare_decide.py on stock uvicorn with the API's settings, on a free port."""
    port = free_port()
    here = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "--app-dir", here, "bare_decide:app",
         "--port", str(port), "--loop", "uvloop", "--http", "httptools",
         "--no-access-log", "--log-level", "warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=1.0, trust_env=False).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)  # polling a starting process, nothing to wait on
    proc.kill()
    raise SystemExit("bare_decide did not start within 30 s")


def bare(ids: list[str], opts: argparse.Namespace) -> None:
    """The fast phase's requests against a FastAPI route of the same shape and no broker."""
    proc, url = start_bare()
    try:
        cpu0 = cpu_seconds(proc.pid)
        results, elapsed, client_s = decide_all(
            [url], ids, opts.processes, opts.connections, None, kind=opts.client
        )
        cpu = cpu_seconds(proc.pid) - cpu0
    finally:
        stop_roles(proc)
    n = len(results)
    rtt_ms = [r[2] * 1000 for r in results]
    print(
        f"framework ceiling: {n} requests to a bare FastAPI route of the same shape on the same"
        f" uvicorn (bench/bare_decide.py), {elapsed:.2f} s: {n / elapsed:.0f} requests/s"
        f" (HTTP p50 {pct(rtt_ms, 0.5):.1f} ms, p99 {pct(rtt_ms, 0.99):.1f} ms)"
    )
    print(f"  its CPU per request: {cpu / n * 1000:.3f} ms (one core's worth: {n / cpu:.0f}/s);"
          f" client processes' CPU per request: {client_s / n * 1000:.3f} ms")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=100.0, help="steady decisions per second")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of the steady phase")
    parser.add_argument("--burst", type=int, default=2000, help="decisions in the fast phase")
    parser.add_argument("--processes", type=int, default=2, help="client processes, fast phase")
    parser.add_argument(
        "--connections", type=int, default=CONNECTIONS, help="connections in all, fast phase"
    )
    parser.add_argument("--clients", type=int, help=argparse.SUPPRESS)  # the old name
    parser.add_argument("--apis", type=int, default=APIS, help="API processes (stateless)")
    parser.add_argument(
        "--webhook", action="store_true", help="fast phase: signed webhook replies, not REST"
    )
    parser.add_argument(
        "--client",
        choices=("aiohttp", "httpx"),
        default="aiohttp",
        help="the client processes' HTTP library (aiohttp: lighter, so more CPU is the API's)",
    )
    parser.add_argument(
        "--no-bare", dest="bare", action="store_false", help="skip the framework-ceiling phase"
    )
    parser.add_argument("--profile", help="py-spy the API in the fast phase into this file")
    parser.add_argument("--profile-format", default="flamegraph", help="py-spy's --format")
    opts = parser.parse_args()
    if opts.clients:
        opts.connections = opts.clients

    with bench_site(CONFIG) as (env, redis, broker, tmp):
        started = [start_api(env) for _ in range(opts.apis)]
        apis, urls = [api for api, _ in started], [url for _, url in started]
        resumer, _ = start_role(["resumer"], env, "resumer ready")
        try:
            ids = make_rounds(broker, int(opts.rate * opts.seconds), "steady")
            steady(urls, redis, ids, opts.rate, opts.client)
            ids = make_rounds(broker, opts.burst, "burst")
            burst(urls, redis, apis, ids, opts, resumer)
            if opts.bare and not opts.webhook:
                bare(ids, opts)
            print(f"machine: {os.cpu_count()} CPUs, {opts.apis} uvicorn process(es), embedded"
                  f" Redis, loopback, {opts.client} clients; load average"
                  f" {os.getloadavg()[0]:.1f}")  # fmt: skip
        finally:
            stop_roles(*apis, resumer)


if __name__ == "__main__":
    main()
