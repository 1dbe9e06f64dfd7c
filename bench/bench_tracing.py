"""What tracing costs a decision: off (no `OTEL_*`), on (a local OTLP receiver), on with the
collector down.

Each mode runs in a child process of its own (tracing is set up once per process, as in a role),
on its own embedded Redis: N requests of N runs are created (inside a span when tracing is on,
as a worker does, so each request carries a `traceparent`), then decided one by one. Prints the
µs per create and per decision in each mode (wall clock, and the CPU time of the process, which
a loaded machine changes far less), and the price of the tracing calls themselves when off
(CPU ns per call: `tracing.span()` entered and left, `tracing.traceparent()`).

Each figure is the least over `--repeat` interleaved rounds of the three modes.
Run: `uv run python bench/bench_tracing.py [--n 3000] [--repeat 3]`.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MODES = ("off", "on", "collector down")


def child(mode: str, n: int) -> dict[str, float]:
    """One mode, in this process: µs per create and per decision (and ns per no-op call)."""
    from redis import Redis

    from broker.domain.models import Decision, NewRequest
    from broker.facade import Broker
    from broker.redis.embedded import EmbeddedRedis
    from broker.tracing import telemetry as tracing

    on = tracing.configure("bench")
    assert on == (mode != "off"), f"tracing should be {'on' if mode != 'off' else 'off'}"
    out: dict[str, float] = {}
    if not on:
        calls = 200_000
        start = time.process_time_ns()
        for _ in range(calls):
            with tracing.span("x"):
                pass
        out["span_ns"] = (time.process_time_ns() - start) / calls
        start = time.process_time_ns()
        for _ in range(calls):
            tracing.traceparent()
        out["traceparent_ns"] = (time.process_time_ns() - start) / calls
    with tempfile.TemporaryDirectory() as tmp, EmbeddedRedis(tmp) as server:
        broker = Broker(Redis.from_url(server.url))
        ids: list[str] = []
        start, cpu = time.perf_counter(), time.process_time()
        for i in range(n):
            with tracing.span("process agent-runs"):
                run = broker.create_run("bench", "go", run_id=f"run_{i}")
                (req,) = broker.create_round(run.id, 1, [NewRequest(tool_name="refund", args={"i": i})])  # fmt: skip
            ids.append(req.id)
        out["create_us"] = (time.perf_counter() - start) / n * 1e6
        out["create_cpu_us"] = (time.process_time() - cpu) / n * 1e6
        start, cpu = time.perf_counter(), time.process_time()
        for request_id in ids:
            broker.decide(request_id, Decision(outcome="approved"), decided_by="alice")
        out["decide_us"] = (time.perf_counter() - start) / n * 1e6
        tracing.shutdown()  # the export thread's work counts: it is this process's CPU
        out["decide_cpu_us"] = (time.process_time() - cpu) / n * 1e6
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_mode(mode: str, n: int, endpoint: str) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    if mode == "on":
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
    elif mode == "collector down":
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{free_port()}"
    done = subprocess.run(
        [sys.executable, __file__, "--child", mode, "--n", str(n)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=3000)
    parser.add_argument("--repeat", type=int, default=3, help="rounds of the modes, interleaved")
    parser.add_argument("--child", choices=MODES)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.n)))
        return
    from tests.support.fakes.otlp_receiver import OtlpReceiver

    receiver = OtlpReceiver().start()
    try:
        rounds = [
            {mode: run_mode(mode, args.n, receiver.endpoint) for mode in MODES}
            for _ in range(args.repeat)
        ]
        # the least of each figure over the rounds: what the work costs with the least noise
        results = {
            mode: {k: min(r[mode][k] for r in rounds) for k in rounds[0][mode]} for mode in MODES
        }
    finally:
        receiver.stop()
    off = results["off"]
    print(
        f"tracing, {args.n} requests per mode, least of {args.repeat} interleaved rounds "
        f"(python bench/bench_tracing.py --n {args.n} --repeat {args.repeat})"
    )
    print("µs per operation: wall clock, and CPU of the process (its export thread included)")
    head = ("mode", "create", "create CPU", "decide", "decide CPU", "CPU vs off")
    print(f"{head[0]:<16}" + "".join(f"{h:>12}" for h in head[1:]))
    for mode, got in results.items():
        extra = got["decide_cpu_us"] - off["decide_cpu_us"]
        cells = (got["create_us"], got["create_cpu_us"], got["decide_us"], got["decide_cpu_us"])
        print(f"{mode:<16}" + "".join(f"{c:>12.1f}" for c in cells) + f"{extra:>+12.1f}")
    print(
        f"off: tracing.span() {off['span_ns']:.0f} ns, tracing.traceparent() "
        f"{off['traceparent_ns']:.0f} ns per call; spans the receiver got: {len(receiver.spans)}"
    )


if __name__ == "__main__":
    main()
