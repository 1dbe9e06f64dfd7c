"""Run every benchmark and print one markdown table: each figure, its target, and whether it is met.

    uv run --group bench python bench/run_all.py [--quick] [--save DIR]

(The `bench` dependency group brings the peers `bench_agents.py` runs beside the broker:
LangGraph and its Postgres and SQLite checkpointers.)

Each bench runs on its own, one after another, as a subprocess (so they don't compete for the
CPUs); their figures are read from what they print (bench_e2e.py with `--json`). The raw Redis
ceiling (pipelined XADD/s from one client) is measured once here, on an embedded Redis of its
own, and the table states the other rates beside it. `--quick` runs smaller sizes (a smoke
test of the table, not figures to quote); `--save DIR` keeps each bench's full output.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from redis import Redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchlib import raw_xadd_per_s  # noqa: E402

from broker.redis.embedded import EmbeddedRedis  # noqa: E402

NUMBER = r"([\d,]+(?:\.\d+)?)"
E2E_REDIS = "unix"
"""How the e2e bench's processes reach Redis: its Unix socket, as `approval-broker up`'s roles
do on one machine by default (`bench_e2e.py --redis tcp` for loopback TCP)."""
TRANSPORT_NAMES = {"unix": "its Unix socket", "tcp": "loopback TCP"}


@dataclass
class Row:
    figure: str
    value: float | None
    unit: str
    target: str = "—"
    met: bool | None = None

    def cells(self) -> list[str]:
        if self.value is None:
            shown = "not measured"
        elif self.value >= 100:
            shown = f"{self.value:,.0f} {self.unit}"
        else:
            shown = f"{self.value:,.1f} {self.unit}"
        verdict = {True: "met", False: "**not met**", None: "—"}[self.met]
        return [self.figure, shown.strip(), self.target, verdict]


def number(pattern: str, text: str) -> float | None:
    """The first number the pattern's group catches in `text`, or None."""
    found = re.search(pattern.replace("{N}", NUMBER), text)
    return float(found.group(1).replace(",", "")) if found else None


def run_bench(
    name: str, args: list[str], save: Path | None, timeout: float, label: str | None = None
) -> str:
    """Run bench/NAME with args; returns its stdout (stderr is kept in the saved copy, named
    `label` or NAME)."""
    command = [sys.executable, str(ROOT / "bench" / name), *args]
    print(f"running {' '.join(command[1:])} ...", file=sys.stderr, flush=True)
    started = time.monotonic()
    try:
        done = subprocess.run(
            command, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
        )
        out, err, code = done.stdout, done.stderr, done.returncode
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        err, code = f"timed out after {timeout:.0f} s", -1
    print(f"  ... {time.monotonic() - started:.0f} s, exit {code}", file=sys.stderr, flush=True)
    if save is not None:
        (save / f"{label or name}.txt").write_text(
            f"$ {' '.join(command)}\n{out}\n--- stderr ---\n{err}"
        )
    if code != 0:
        print(f"  {name} failed: {(err or out).strip()[-500:]}", file=sys.stderr, flush=True)
    return out


def raw_ceiling(n: int = 100_000, batch: int = 1000) -> float:
    """Pipelined XADDs per second from one client to a fresh embedded Redis (AOF on)."""
    with tempfile.TemporaryDirectory(prefix="bench-ceiling-") as tmp, EmbeddedRedis(tmp) as server:
        redis = Redis.from_url(server.url)
        rate = raw_xadd_per_s(redis, n, batch)
        redis.close()
        return rate


def at_least(target: float, unit: str) -> tuple[str, Callable[[float], bool]]:
    return f">= {target:,.0f} {unit}", lambda v: v >= target


def below(target: float, unit: str) -> tuple[str, Callable[[float], bool]]:
    return f"< {target:,.0f} {unit}", lambda v: v < target


def row(
    figure: str,
    value: float | None,
    unit: str,
    rule: tuple[str, Callable[[float], bool]] | None = None,
) -> Row:
    if rule is None:
        return Row(figure, value, unit)
    text, ok = rule
    return Row(figure, value, unit, text, None if value is None else ok(value))


def core_rows(text: str, ceiling: float) -> list[Row]:
    creates = number(r"creates/s, \d+ threads\s*: *{N}", text)
    share = f" ({creates / ceiling:.0%} of the ceiling)" if creates else ""
    batched = number(r"batches of 100\s*: *{N}", text)
    own_ceiling = number(r"\(ceiling\) *: *{N}", text)  # measured beside it, in the same run
    batched_share = 100 * batched / own_ceiling if batched and own_ceiling else None
    distinct = number(r"100 distinct requests\s*: *{N}", text)
    distinct_share = 100 * distinct / own_ceiling if distinct and own_ceiling else None
    rounds = number(r"interleaved copies *, ({N}) rounds", text)
    copies_median = number(r"interleaved copies *, \d+ rounds : *{N}%", text)
    distinct_median = number(r"interleaved distinct, \d+ rounds : *{N}%", text)
    return [
        row("core: creates/s, 1 thread", number(r"creates/s, 1 thread\s*: *{N}", text), "/s"),
        row(f"core: creates/s, 4 threads{share}", creates, "/s"),
        row("core: creates/s, batches of 100", batched, "/s"),
        row(
            "core: batched creates as a share of the XADD ceiling measured before them",
            batched_share,
            "%",
        ),
        row(
            f"core: batched creates as a share of the XADD ceiling measured beside them"
            f" (median of {rounds or 0:.0f} interleaved rounds)",
            copies_median,
            "%",
            at_least(40, "%"),  # issue 18
        ),
        row("core: creates/s, batches of 100 distinct requests", distinct, "/s"),
        row(
            "core: the same with 100 distinct requests per batch (no shared encoding)",
            distinct_share,
            "%",
        ),
        row(
            "core: the same, median of the interleaved rounds",
            distinct_median,
            "%",
            at_least(40, "%"),
        ),
        row(
            "core: decisions/s, 4 threads", number(r"decisions/s, \d+ threads\s*: *{N}", text), "/s"
        ),
        row(
            "core: Redis memory per pending request",
            number(r"per pending request: *{N}", text),
            "bytes",
            below(2048, "bytes"),
        ),
    ]


def sweep_rows(text: str) -> list[Row]:
    sizes = re.findall(r"^\s*([\d,]+) \|\s*(\d+) \|\s*([\d.]+) \|", text, re.M)
    rows = [
        row(f"sweep: 1,000 due among {int(p.replace(',', '')):,} pending", float(ms), "ms")
        for p, _, ms in sizes
    ]
    if len(sizes) >= 2:
        first, last = float(sizes[0][2]), float(sizes[-1][2])
        rows.append(
            Row(
                f"sweep: time at the largest size / at the smallest ({sizes[-1][0]} vs {sizes[0][0]})",
                last / first,
                "x",
                "flat: <= 2 x",
                last / first <= 2,
            )
        )
    rows.append(row("sweep: loop lateness, max", number(r"lateness.*max {N} ms", text), "ms"))
    return rows


def reads_rows(text: str) -> list[Row]:
    rows = [
        row(
            f"reads: slowest 50-item listing at {int(p.replace(',', '')):,} stored",
            max(float(a), float(b), float(c)),
            "ms",
        )
        for p, a, b, c in re.findall(
            r"^\s*([\d,]+) \|\s*([\d.]+) \|\s*([\d.]+) \|\s*([\d.]+)$", text, re.M
        )
    ]
    if rows:
        rows[-1] = row(rows[-1].figure, rows[-1].value, "ms", below(20, "ms"))
    rows.append(
        row(
            "reads: largest / smallest size, worst listing",
            number(r"worst listing: {N} x", text),
            "x",
            ("flat: <= 2 x", lambda v: v <= 2),
        )
    )
    rows.append(
        row(
            "reads: Redis memory per pending request, all indexes",
            number(r"memory per pending request: {N} bytes", text),
            "bytes",
            below(2048, "bytes"),
        )
    )
    return rows


def notify_rows(text: str) -> list[Row]:
    one = number(r"1 notifier process\(es\): \d+ delivered in [\d.]+ s = {N} requests/s", text)
    three = number(r"3 notifier process\(es\): \d+ delivered in [\d.]+ s = {N} requests/s", text)
    return [
        row("notify: webhook deliveries/s, 1 notifier", one, "/s"),
        row("notify: webhook deliveries/s, 3 notifiers", three, "/s", at_least(1000, "/s")),
    ]


def api_rows(text: str, before: str) -> list[Row]:
    """The decision figures; `before`: the fast phase again with 8 connections, as every run
    before 32 became bench_api's default (a row of its own, without the target)."""
    return [
        row(
            "api: decision -> resume enqueued p50, 100 decisions/s",
            number(r"resume job enqueued.*p50 {N} ms", text),
            "ms",
        ),
        row(
            "api: decision -> resume enqueued p99, 100 decisions/s",
            number(r"resume job enqueued.*p99 {N} ms", text),
            "ms",
            below(10, "ms"),
        ),
        row(
            f"api: decisions/s over HTTP, {_connections(text)} connections",
            number(r"{N} decisions/s", text),
            "/s",
            at_least(1500, "/s"),
        ),
        row(
            "api: the framework's ceiling: the same requests to a bare FastAPI route of the "
            "decide route's shape, no broker (bench/bare_decide.py)",
            number(r"framework ceiling: .*?: {N} requests/s", text),
            "/s",
        ),
        row(
            f"api: the same, {_connections(before)} connections (the earlier default)",
            number(r"{N} decisions/s", before),
            "/s",
        ),
        *(
            row(
                f"api: the machine's CPUs busy in the fast phase, {_connections(t)} connections",
                number(r"busy: {N}%", t),
                "%",
            )
            for t in (text, before)
        ),
    ]


def _connections(text: str) -> str:
    """How many keep-alive connections a bench_api fast phase had, as it printed them."""
    found = re.search(r"(\d+) client processes x (\d+) keep-alive", text)
    return str(int(found.group(1)) * int(found.group(2))) if found else "?"


def rules_rows(text: str) -> list[Row]:
    return [
        row("rules: creates/s, 0 rules", number(r"creates/s, 0 rules\s*: *{N}", text), "/s"),
        row(
            "rules: creates/s, 1,000 active rules",
            number(r"creates/s, [\d,]+ rules \(none covers the call\)\s*: *{N}", text),
            "/s",
        ),
        row(
            "rules: creates/s with 1,000 rules as a share of those with none",
            number(r"ratio, [\d,]+ rules / 0 \(target >= 80%\)\s*: *{N}", text),
            "%",
            at_least(80, "%"),
        ),
    ]


def remote_rows(text: str) -> list[Row]:
    """Decision -> tool executed, and the long-poll wake-up (bench_remote.py)."""
    paths = [
        ("remote: long-poll wake-up", r"long-poll wake-up"),
        ("remote: outside the fleet, live: decision -> tool", r"live \(live_wait_s=30\)"),
        (
            "remote: outside the fleet, stop-and-resume: decision -> tool",
            r"stop-and-resume \(results_for",
        ),
        ("remote: fleet, live_wait_s: decision -> tool", r"fleet, live_wait_s=30"),
        ("remote: fleet, stop-and-resume: decision -> tool", r"fleet, stop-and-resume"),
    ]
    rows: list[Row] = []
    for figure, label in paths:
        for q in ("p50", "p99"):
            rows.append(
                row(f"{figure} {q}", number(label + r"[^\n]*? " + q + r" {N} ms", text), "ms")
            )
    return rows


def agents_rows(text: str) -> list[Row]:
    """The whole agent cycle beside LangGraph (bench_agents.py --json)."""
    lines = [line for line in text.splitlines() if line.startswith("{")]
    res: dict[str, Any] = json.loads(lines[-1]) if lines else {}
    ours, pg = res.get("approval-broker", {}), res.get("LangGraph + PostgresSaver", {})
    rows = [
        row(f"agents: whole cycles/s, 200 at once, {name}", r.get("runs_per_s"), "/s")
        for name, r in res.items()
    ]
    if ours and pg:
        twice = 2 * pg["runs_per_s"]
        rows.append(
            row("agents: whole cycles/s, approval-broker", ours["runs_per_s"], "/s",
                (f">= {twice:,.1f} /s (2x LangGraph+Postgres)", lambda v: v >= twice))
        )  # fmt: skip
        cap = min(15.0, pg["p50_ms"])
        rows.append(
            row("agents: decision -> run finished p50, approval-broker", ours["p50_ms"], "ms",
                (f"<= {cap:.1f} ms", lambda v: v <= cap))
        )  # fmt: skip
    cpu = ours.get("cpu_ms_per_cycle")
    if cpu:
        rows.append(row("agents: CPU per cycle, every process of `up`", sum(cpu.values()), "ms"))
        rows.append(row("agents: CPU per cycle, the worker", cpu.get("worker"), "ms"))
    slow = ours.get("slow", {})
    rows.append(row("agents: slow model, 200 runs, seconds", slow.get("seconds"), "s", below(15, "s")))  # fmt: skip
    mb = slow.get("mb_per_run_in_flight")
    rows.append(row("agents: worker memory per run in flight", mb, "MB", ("<= 2 MB", lambda v: v <= 2)))  # fmt: skip
    return rows


def _e2e_json(text: str) -> dict[str, Any] | None:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)  # type: ignore[no-any-return]
    return None


def e2e_rows(text: str, every_event: str, ceiling: float) -> list[Row]:
    """The e2e figures; `every_event`: the throughput phase again as every run before this
    pass measured it: the receiver's endpoint sent every event type (`--events all`, as before
    webhooks had `events`) and 16 replies in flight (`--receiver-threads 16`)."""
    data, before = _e2e_json(text), _e2e_json(every_event)
    if data is None:
        return [row("e2e: approval cycles/s", None, "/s", at_least(800, "/s"))]
    fast, steady = data["throughput"], data["steady"]
    at = f"at {steady['rate']:.0f}/s"
    over = TRANSPORT_NAMES.get(data.get("redis", "tcp"), data.get("redis"))
    return [
        row(
            f"e2e: approval cycles/s, created -> delivered -> decided -> resume enqueued, "
            f"Redis over {over}, the deciding endpoint sent `approval.requested`, "
            f"{data.get('replies_in_flight', '?')} replies in flight "
            f"({fast['cycles_per_s'] / ceiling:.1%} of the ceiling)",
            fast["cycles_per_s"],
            "/s",
            at_least(800, "/s"),
        ),
        row(
            "e2e: the same as measured before: the endpoint sent every event type "
            "(`approval.decided` too: two deliveries per cycle), "
            f"{(before or {}).get('replies_in_flight', '?')} replies in flight",
            before["throughput"]["cycles_per_s"] if before else None,
            "/s",
        ),
        redis_bound(fast),
        row(f"e2e: created -> webhook delivered p50 {at}", steady["delivered_p50_ms"], "ms"),
        row(
            f"e2e: created -> webhook delivered p99 {at}",
            steady["delivered_p99_ms"],
            "ms",
            below(50, "ms"),
        ),
        row(f"e2e: created -> resume enqueued p50 {at}", steady["resume_enqueued_p50_ms"], "ms"),
        row(f"e2e: created -> resume enqueued p99 {at}", steady["resume_enqueued_p99_ms"], "ms"),
    ]


def redis_bound(fast: dict[str, Any]) -> Row:
    """Cycles/s one Redis core could carry, from the Redis CPU each cycle cost in the run."""
    redis_s = fast["cpu_s"].get("redis") or 0.0
    per_cycle = redis_s / fast["cycles"] * 1000
    return row(
        f"e2e: cycles/s one Redis core could carry ({per_cycle:.2f} ms of Redis CPU per cycle)",
        fast["cycles"] / redis_s if redis_s else None,
        "/s",
    )


def e2e_cpu(text: str) -> str:
    data = _e2e_json(text)
    if data is None:
        return ""
    fast = data["throughput"]
    return ", ".join(
        f"{k} {v:.1f} s ({v / fast['cycles'] * 1000:.2f} ms/cycle)"
        for k, v in fast["cpu_s"].items()
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: checks the table only")
    parser.add_argument("--save", type=Path, help="keep each bench's output in this directory")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per bench")
    opts = parser.parse_args()
    if opts.save:
        opts.save.mkdir(parents=True, exist_ok=True)
    quick = opts.quick
    e2e_common = ["--json", "--redis", E2E_REDIS, "--cycles", "500" if quick else "5000"]
    benches = {
        "bench_core.py": ["--n", "2000" if quick else "20000"],
        "bench_sweep.py": ["--sizes", "5000,20000" if quick else "10000,100000,1000000"],
        "bench_notify.py": ["--requests", "1000" if quick else "10000"],
        "bench_reads.py": ["--sizes", "5000,20000" if quick else "10000,100000,1000000"],
        "bench_api.py": [
            "--seconds",
            "3" if quick else "10",
            "--burst",
            "300" if quick else "10000",
        ],
        "bench_rules.py": ["--n", "500" if quick else "3000"],
        "bench_remote.py": ["--runs", "10" if quick else "50"],
        "bench_e2e.py": [*e2e_common, "--seconds", "3" if quick else "10"],
        "bench_agents.py": ["--json", "--latency", "10" if quick else "50"]
        + (["--runs", "50", "--slow-runs", "50"] if quick else []),
    }

    started = time.monotonic()
    ceiling = raw_ceiling(20_000 if quick else 100_000)
    out = {name: run_bench(name, args, opts.save, opts.timeout) for name, args in benches.items()}
    api_before = run_bench(
        "bench_api.py",
        [
            "--seconds",
            "2",
            "--burst",
            "300" if quick else "10000",
            "--connections",
            "8",
            "--no-bare",
        ],
        opts.save,
        opts.timeout,
        "bench_api.py-8-connections",
    )
    e2e_before = run_bench(
        "bench_e2e.py",
        [*e2e_common, "--seconds", "2", "--events", "all", "--receiver-threads", "16"],
        opts.save,
        opts.timeout,
        "bench_e2e.py-every-event",
    )
    rows = [
        Row("raw Redis ceiling: pipelined XADD/s, one client", ceiling, "/s"),
        *core_rows(out["bench_core.py"], ceiling),
        *sweep_rows(out["bench_sweep.py"]),
        *notify_rows(out["bench_notify.py"]),
        *reads_rows(out["bench_reads.py"]),
        *api_rows(out["bench_api.py"], api_before),
        *rules_rows(out["bench_rules.py"]),
        *remote_rows(out["bench_remote.py"]),
        *e2e_rows(out["bench_e2e.py"], e2e_before, ceiling),
        *agents_rows(out["bench_agents.py"]),
    ]

    today = datetime.date.today().isoformat()
    print(
        f"Benchmarks, {today}, {os.cpu_count()} CPUs, embedded Redis (AOF on), loopback "
        f"(e2e: Redis over {TRANSPORT_NAMES[E2E_REDIS]})"
        f"{' (--quick: sizes too small to quote)' if quick else ''}; "
        f"`uv run --group bench python bench/run_all.py{' --quick' if quick else ''}` "
        f"({time.monotonic() - started:.0f} s)\n"
    )
    print("| figure | value | target | met |")
    print("|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r.cells()) + " |")
    for what, text in (("", out["bench_e2e.py"]), (", as measured before", e2e_before)):
        cpu = e2e_cpu(text)
        if cpu:
            print(
                f"\nCPU seconds per process in the e2e throughput phase{what} (Redis over "
                f"{TRANSPORT_NAMES[E2E_REDIS]}): {cpu}"
            )


if __name__ == "__main__":
    main()
