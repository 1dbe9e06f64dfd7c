"""End-to-end approval cycles: created -> delivered to a webhook -> decided -> resume enqueued.

    uv run python bench/bench_e2e.py [--cycles 5000] [--rate 100] [--seconds 10] [--json]
    uv run python bench/bench_e2e.py --layouts 1x1,1x2,2x1,2x2   # APIs x notifiers, a run each
    uv run python bench/bench_e2e.py --redis tcp                 # loopback TCP, not the socket
    uv run python bench/bench_e2e.py --layouts 2x2:unix,2x2:tcp  # both transports, a run each
    uv run python bench/bench_e2e.py --events all                # approval.decided sent too

Everything runs on this machine as separate processes: an embedded Redis (AOF on), `approval-
broker api` (x2), `approval-broker notifier` (x2), `approval-broker resumer`, and a webhook
receiver that verifies each delivery and approves it through the signed
`/v1/webhooks/{name}/replies` of the API (bench/webhook_receiver.py: Starlette on uvicorn,
replying with httpx from the same loop; `--receiver threaded` for
tests/support/fakes/deciding_receiver.py). Its
endpoint is sent `approval.requested` only, what it decides on (`--events all`: every event
type, `approval.decided` too, as before webhooks had `events`). A cycle is one
round of one run with one request; it ends when the resumer has put the run's resume job on the
RQ queue (no agent worker runs here: executing agents is the worker fleet's cost, not the
broker's). Every process (this one too) talks to Redis over its Unix socket, as `approval-broker
up`'s roles do (`--redis tcp`: over loopback TCP, as a role given a `redis://` URL does).

1. Throughput: `--cycles` requests are created first with the notifiers' group pointed past
   them; once every process is up the group is rewound and the clock starts. It stops when the
   last resume job is enqueued. Cycles/s = cycles / that time.
2. Latency at a steady load: requests are created at `--rate` per second for `--seconds`; for
   each, created -> webhook delivered (the receiver's clock, same machine) and created -> resume
   job enqueued (RQ's `enqueued_at`). p50/p99.

CPU seconds per process during the throughput phase are printed too (and CPU ms per cycle),
with the Redis round trips per cycle of all roles together, as Redis counts them
(`benchlib.redis_round_trips`: INFO stats, nothing counted inside the broker).
"""

from __future__ import annotations

import argparse
import base64
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

from redis import Redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchlib import enqueued_at, make_rounds, pct, raw_xadd_per_s, redis_round_trips  # noqa: E402

from broker.domain.config import load_config  # noqa: E402
from broker.domain.models import NewRequest  # noqa: E402
from broker.facade import Broker  # noqa: E402
from broker.redis.embedded import EmbeddedRedis, free_port  # noqa: E402
from broker.runs.starting import resume_job_id, run_queue  # noqa: E402
from broker.store.keys import NOTIFIER_GROUP  # noqa: E402

SECRET = "whsec_" + base64.b64encode(b"bench-e2e-webhook-secret-0123456").decode()
CLI = [sys.executable, "-m", "approval_broker"]
REPLIES_IN_FLIGHT = 64
"""Replies the receiver sends at once (`--receiver-threads`; the threaded receiver's threads).
With 16 (the earlier default) the receiver, not the broker, set the pace: 16 replies in flight
over a ~16 ms round trip is 1,000 cycles/s, whatever the broker could carry, and each API, the
resumer and Redis got one or two calls per batch. With 64 the same cycles cost a third less CPU
(README "Benchmarks": alternating runs, 16 vs 64)."""
EVENTS = {"requested": 'events = ["approval.requested"]', "all": ""}
"""The receiver's `[webhooks.bench] events` (`--events`). It decides, so by default it is sent
what a deciding endpoint needs: each request as it comes (`approval.requested`), one delivery
per cycle. `all` also sends it every `approval.decided`, as every run did before webhooks had
`events`: two deliveries per cycle."""
TARGET_CYCLES = 1000.0
TARGET_P99_MS = 50.0
TRANSPORTS = ("unix", "tcp")
RECEIVERS = {  # both verify every delivery with standardwebhooks and reply the same way
    "stock": [str(ROOT / "bench" / "webhook_receiver.py")],
    "threaded": ["-m", "tests.support.fakes.deciding_receiver"],
}


class Proc:
    """A role (or the receiver) as a subprocess, with its output drained to a log file."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.name = name
        self.log = log
        with log.open("wb") as sink:
            self.process = subprocess.Popen(
                argv, env=env, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT
            )

    def wait_for(self, text: str, timeout: float = 240.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.log.read_text(errors="replace").splitlines():
                if text in line:
                    return line
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        raise SystemExit(f"{self.name} did not say {text!r}:\n{self.log.read_text()[-2000:]}")

    def cpu_s(self) -> float:
        try:
            stat = Path(f"/proc/{self.process.pid}/stat").read_text()
        except OSError:
            return 0.0
        fields = stat[stat.rindex(")") + 2 :].split()
        return sum(int(x) for x in fields[11:13]) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


def wait_queue_length(redis: Redis, key: str, n: int, timeout: float) -> float:
    """Poll until the RQ queue holds n jobs; returns when (perf_counter)."""
    deadline = time.monotonic() + timeout
    while True:
        if redis.llen(key) >= n:
            return time.perf_counter()
        if time.monotonic() > deadline:
            raise SystemExit(f"only {redis.llen(key)}/{n} resume jobs enqueued in {timeout:.0f} s")
        time.sleep(0.005)


def make_backlog(broker: Broker, n: int) -> float:
    """Create n cycles the notifiers can't see yet (their group starts past them); returns /s.

    The group is moved past the backlog once it is written: made with `$` on a new, empty
    stream it would start at 0-0, so the notifiers would deliver the whole backlog before the
    clock starts (to APIs not up yet) and once more after the rewind.
    """
    stream = broker.keys.stream("default")
    broker.redis.xgroup_create(stream, NOTIFIER_GROUP, id="$", mkstream=True)
    started = time.perf_counter()
    make_rounds(broker, n, "fast")
    rate = n / (time.perf_counter() - started)
    broker.redis.xgroup_setid(stream, NOTIFIER_GROUP, "$")
    return rate


def start_profiles(procs: list[Proc], where: Path) -> list[subprocess.Popen[bytes]]:
    """`--profile DIR`: py-spy (`--gil`, raw collapsed stacks) on the first API and the first
    notifier, one file each in DIR (CPU figures of a profiled run are not comparable)."""
    where.mkdir(parents=True, exist_ok=True)
    return [
        subprocess.Popen(
            [
                "py-spy",
                "record",
                "--gil",
                "--pid",
                str(p.process.pid),
                "--rate",
                "200",
                "--format",
                "raw",
                "--output",
                str(where / f"{p.name}.txt"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        for p in procs
        if p.name in ("api-1", "notifier-1")
    ]


def stop_profiles(profilers: list[subprocess.Popen[bytes]]) -> None:
    for profiler in profilers:
        profiler.send_signal(signal.SIGINT)  # py-spy writes its output and exits
        profiler.wait(30)


def throughput(
    broker: Broker,
    procs: list[Proc],
    receiver_url: str,
    n: int,
    timeout: float,
    profile: Path | None = None,
) -> dict[str, Any]:
    """Rewind the notifiers' group onto the backlog and time it until every resume is enqueued."""
    stream = broker.keys.stream("default")
    profilers = start_profiles(procs, profile) if profile else []
    if profilers:
        time.sleep(1.0)  # py-spy attached
    queue_key = run_queue(broker).key
    cpu_before = {p.name: p.cpu_s() for p in procs}
    trips_before = redis_round_trips(broker.redis)
    own_before = sum(os.times()[:2])
    redis_before = _redis_cpu(broker.redis)
    base = get_json(f"{receiver_url}/stats").get("reply_200", 0)
    broker.redis.xgroup_setid(stream, NOTIFIER_GROUP, "0")  # the clock starts now
    t0 = time.perf_counter()
    t_end = wait_queue_length(broker.redis, queue_key, n, timeout)
    seconds = t_end - t0
    stop_profiles(profilers)
    cpu = {p.name: round(p.cpu_s() - cpu_before[p.name], 2) for p in procs}
    cpu["redis"] = round(_redis_cpu(broker.redis) - redis_before, 2)
    cpu["bench (this process)"] = round(sum(os.times()[:2]) - own_before, 2)
    trips = {"all roles": redis_round_trips(broker.redis) - trips_before - 1}  # less one INFO
    replies = get_json(f"{receiver_url}/stats").get("reply_200", 0) - base
    return {
        "cycles": n,
        "seconds": round(seconds, 2),
        "cycles_per_s": round(n / seconds, 1),
        "replies_200": replies,
        "cpu_s": cpu,
        "cpu_ms_per_cycle": {k: round(v * 1000 / n, 3) for k, v in cpu.items()},
        "round_trips_per_cycle": {k: round(v / n, 2) for k, v in trips.items() if v},
    }


def _redis_cpu(redis: Redis) -> float:
    info = redis.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def latency(
    broker: Broker,
    procs: list[Proc],
    receiver_url: str,
    rate: float,
    seconds: float,
    timeout: float,
) -> dict[str, Any]:
    """Latencies at a steady `rate`, and CPU per cycle at that rate (the batches are as small
    as they get, so a cost per message shows here rather than in the throughput phase)."""
    queue_key = run_queue(broker).key
    broker.redis.delete(queue_key)
    n = int(rate * seconds)
    cpu_before = {p.name: p.cpu_s() for p in procs}
    redis_before = _redis_cpu(broker.redis)
    own_before = sum(os.times()[:2])  # this process creates the requests here
    created: dict[str, float] = {}
    start = time.perf_counter() + 0.2
    for i in range(n):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        run = broker.create_run("bench", "go", run_id=f"run_steady_{i}")
        (req,) = broker.create_round(run.id, 1, [NewRequest(tool_name="refund", args={"i": i})])
        created[req.id] = req.created_at.timestamp()
    achieved = n / (time.perf_counter() - start)
    wait_queue_length(broker.redis, queue_key, n, timeout)
    cpu = {p.name: p.cpu_s() - cpu_before[p.name] for p in procs}
    cpu["redis"] = _redis_cpu(broker.redis) - redis_before
    cpu["bench (this process)"] = sum(os.times()[:2]) - own_before
    times = get_json(f"{receiver_url}/times")["requested"]
    missing = [rid for rid in created if rid not in times]
    if missing:
        raise SystemExit(f"{len(missing)} requests never reached the receiver")
    delivered = [(times[rid] - at) * 1000 for rid, at in created.items()]
    jobs = {rid: resume_job_id(rid.split(".")[0], 1) for rid in created}
    enq = enqueued_at(broker.redis, list(jobs.values()))
    cycle = [(enq[jobs[rid]] - at) * 1000 for rid, at in created.items()]
    return {
        "requests": n,
        "rate": round(achieved, 1),
        "delivered_p50_ms": round(pct(delivered, 0.5), 1),
        "delivered_p99_ms": round(pct(delivered, 0.99), 1),
        "delivered_max_ms": round(max(delivered), 1),
        "resume_enqueued_p50_ms": round(pct(cycle, 0.5), 1),
        "resume_enqueued_p99_ms": round(pct(cycle, 0.99), 1),
        "cpu_ms_per_cycle": {k: round(v * 1000 / n, 3) for k, v in cpu.items()},
    }


def run_bench(
    opts: argparse.Namespace, apis: int, notifiers: int, transport: str
) -> dict[str, Any]:
    """One full run (fresh Redis and processes): the throughput and the steady phase, every
    process on Redis over `transport` (unix: its socket; tcp: loopback)."""
    with tempfile.TemporaryDirectory(prefix="bench-e2e-") as tmp:
        work = Path(tmp)
        server = EmbeddedRedis(work / "redis").start()
        procs: list[Proc] = []
        try:
            redis_url = server.url if transport == "tcp" else server.unix_url
            if redis_url is None:
                raise SystemExit(f"{server.data_dir} is too long a path for a Unix socket")
            api_ports = [free_port() for _ in range(apis)]
            env = {**os.environ, "PYTHONUNBUFFERED": "1"}
            receiver = Proc(
                "receiver",
                [
                    sys.executable, *RECEIVERS[opts.receiver], "--secret", SECRET,
                    "--endpoint", "bench", "--mix", "approve=1",
                    "--threads", str(opts.receiver_threads),
                    *(arg for p in api_ports for arg in ("--api", f"http://127.0.0.1:{p}")),
                ],
                env,
                work / "receiver.log",
            )  # fmt: skip
            procs.append(receiver)
            receiver_url = receiver.wait_for("listening on ").split("listening on ", 1)[1]
            config_path = work / "bench.toml"
            config_path.write_text(
                f"""
[queues.default]
channels = ["webhook:bench"]
timeout_s = 3600

[webhooks.bench]
url = "{receiver_url}/hook"
secret = "{SECRET}"
roles = ["ops"]
max_attempts = 20
backoff_s = 0.05
max_backoff_s = 1.0
{EVENTS[opts.events]}
"""
            )
            env |= {
                "APPROVAL_BROKER_REDIS_URL": redis_url,
                "APPROVAL_BROKER_CONFIG": str(config_path),
                "APPROVAL_BROKER_DATA_DIR": str(work / "data"),
                "APPROVAL_BROKER_NOTIFIER_BLOCK_MS": "100",
            }
            roles: list[tuple[str, list[str], str]] = [
                *(
                    (f"api-{i + 1}", ["api", "--port", str(p)], "API listening on")
                    for i, p in enumerate(api_ports)
                ),
                *((f"notifier-{i + 1}", ["notifier"], "reading queues") for i in range(notifiers)),
                *((f"resumer-{i + 1}", ["resumer"], "resumer") for i in range(opts.resumers)),
            ]
            broker = Broker(Redis.from_url(redis_url), load_config(config_path))
            backlog_rate = make_backlog(broker, opts.cycles)
            for name, argv, _ in roles:
                procs.append(Proc(name, [*CLI, *argv], env, work / f"{name}.log"))
            for proc, (_, _, ready) in zip(procs[1:], roles, strict=True):
                proc.wait_for(ready)

            fast = throughput(broker, procs, receiver_url, opts.cycles, opts.timeout, opts.profile)
            steady = latency(broker, procs, receiver_url, opts.rate, opts.seconds, opts.timeout)
            ceiling = raw_xadd_per_s(broker.redis, 50_000)
        finally:
            for proc in reversed(procs):
                proc.stop()
            server.close()

    return {
        "cpus": os.cpu_count(),
        "redis": transport,
        "processes": {"api": apis, "notifier": notifiers, "resumer": opts.resumers},
        "events": opts.events,
        "replies_in_flight": opts.receiver_threads,
        "throughput": {**fast, "backlog_created_per_s": round(backlog_rate, 1)},
        "steady": steady,
        "raw_xadd_per_s": round(ceiling),
    }


def parse_layout(item: str, transport: str) -> tuple[int, int, str]:
    """`2x1` (on `transport`) or `2x1:tcp` -> (APIs, notifiers, transport)."""
    shape, _, given = item.partition(":")
    apis, notifiers = (int(n) for n in shape.split("x"))
    if given and given not in TRANSPORTS:
        raise SystemExit(f"--layouts: {given!r} is not one of {', '.join(TRANSPORTS)}")
    return apis, notifiers, given or transport


def compare_layouts(opts: argparse.Namespace) -> None:
    """Run each `--layouts` APIxNOTIFIERS[:unix|tcp] in turn; cycles/s and CPU per cycle by role."""
    layouts = [parse_layout(item, opts.redis) for item in opts.layouts.split(",")]
    print(f"{os.cpu_count()} CPUs, {opts.cycles} cycles each; CPU ms per cycle by role")
    print(
        "layout (api x notifier) | Redis over | cycles/s | api | notifier | resumer | receiver "
        "| redis | bench | all | all at the steady rate"
    )
    rows = []
    for apis, notifiers, transport in layouts:
        result = run_bench(opts, apis, notifiers, transport)
        fast = result["throughput"]
        per = fast["cpu_ms_per_cycle"]
        role = {
            r: sum(v for k, v in per.items() if k.startswith(r))
            for r in ("api", "notifier", "resumer", "receiver", "redis", "bench")
        }
        rows.append({"apis": apis, "notifiers": notifiers, **result})
        print(
            f"{apis} x {notifiers} | {transport} | {fast['cycles_per_s']:,.0f} | "
            f"{role['api']:.2f} | {role['notifier']:.2f} | {role['resumer']:.2f} | "
            f"{role['receiver']:.2f} | {role['redis']:.2f} | {role['bench']:.2f} | "
            f"{sum(role.values()):.2f} | {sum(result['steady']['cpu_ms_per_cycle'].values()):.2f}",
            flush=True,
        )
    if opts.json:
        print(json.dumps(rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=5000, help="cycles in the throughput phase")
    parser.add_argument("--rate", type=float, default=100.0, help="requests/s, latency phase")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of the latency phase")
    parser.add_argument("--apis", type=int, default=2)
    parser.add_argument("--notifiers", type=int, default=2)
    parser.add_argument("--resumers", type=int, default=1)
    parser.add_argument(
        "--layouts",
        default="",
        help="compare process layouts, APIxNOTIFIERS[:unix|tcp] separated by commas "
        "(1x1,2x2:tcp): a run each",
    )
    parser.add_argument(
        "--redis",
        choices=TRANSPORTS,
        default="unix",
        help="how every process reaches Redis: unix (its socket, as `up`'s roles) or tcp",
    )
    parser.add_argument(
        "--receiver-threads",
        type=int,
        default=REPLIES_IN_FLIGHT,
        help="replies the receiver has in flight at once (see REPLIES_IN_FLIGHT)",
    )
    parser.add_argument(
        "--events",
        choices=sorted(EVENTS),
        default="requested",
        help="what the receiver's endpoint is sent (see EVENTS)",
    )
    parser.add_argument(
        "--receiver",
        choices=sorted(RECEIVERS),
        default="stock",
        help="stock: bench/webhook_receiver.py (Starlette on uvicorn); threaded: the tests'"
        " http.server one",
    )
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument(
        "--profile",
        type=Path,
        help="py-spy the first API and notifier in the throughput phase into this folder",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object at the end")
    opts = parser.parse_args()

    if opts.layouts:
        compare_layouts(opts)
        return
    result = run_bench(opts, opts.apis, opts.notifiers, opts.redis)
    fast, steady, ceiling = result["throughput"], result["steady"], result["raw_xadd_per_s"]
    if opts.json:
        print(json.dumps(result))
        return
    cpu = ", ".join(f"{k} {v:.1f}" for k, v in fast["cpu_s"].items())
    print(
        f"{os.cpu_count()} CPUs; {opts.apis} API, {opts.notifiers} notifier, {opts.resumers} "
        f"resumer process(es), Redis over {opts.redis}; receiver approves every request over "
        f"signed webhook replies ({opts.receiver_threads} in flight); its endpoint is sent "
        f"{opts.events} events"
    )
    print(
        f"throughput: {fast['cycles']} cycles (created -> delivered -> decided -> resume "
        f"enqueued) in {fast['seconds']:.2f} s = {fast['cycles_per_s']:,.0f} cycles/s "
        f"(target >= {TARGET_CYCLES:,.0f}: {'met' if fast['cycles_per_s'] >= TARGET_CYCLES else 'NOT met'})"
    )
    print(f"  CPU seconds in that phase: {cpu}")
    per = ", ".join(f"{k} {v:.2f}" for k, v in fast["cpu_ms_per_cycle"].items())
    print(f"  CPU ms per cycle: {per}")
    trips = ", ".join(f"{k} {v:.2f}" for k, v in fast["round_trips_per_cycle"].items())
    print(f"  Redis round trips per cycle: {trips}")
    print(
        f"steady {steady['rate']:.0f} requests/s for {opts.seconds:.0f} s: created -> webhook "
        f"delivered p50 {steady['delivered_p50_ms']} ms, p99 {steady['delivered_p99_ms']} ms "
        f"(target p99 < {TARGET_P99_MS:.0f} ms: "
        f"{'met' if steady['delivered_p99_ms'] < TARGET_P99_MS else 'NOT met'}); "
        f"created -> resume enqueued p50 {steady['resume_enqueued_p50_ms']} ms, "
        f"p99 {steady['resume_enqueued_p99_ms']} ms"
    )
    per = ", ".join(f"{k} {v:.2f}" for k, v in steady["cpu_ms_per_cycle"].items())
    print(f"  CPU ms per cycle at {steady['rate']:.0f}/s: {per}")
    print(f"raw pipelined XADD/s on the same Redis (ceiling): {ceiling:,.0f}")


if __name__ == "__main__":
    main()
