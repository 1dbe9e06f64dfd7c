"""Rule matching's cost per create: 0 vs 1,000 active rules, on the embedded Redis.

Each create here is `Broker.create_request` plus what the wired create step will add before
its Lua: `RuleStore.match` (the version GET, then matching against the cached, indexed rules).
Prints matching cost per call, creates/s with 0 and 1,000 rules and their ratio (target >= 80%),
and the one-off re-read after a rule changes. Run: `uv run python bench/bench_rules.py [--n 3000]`.
"""

from __future__ import annotations

import argparse
import tempfile
import time

from redis import Redis

from broker.client import Broker
from broker.config import parse_config
from broker.models import NewRequest
from broker.redis_server import EmbeddedRedis
from broker.rules import Call, RuleStore, parse_body

TOOLS = [f"tool_{i}" for i in range(30)] + ["refund"]
AGENTS = [f"agent_{i}" for i in range(10)]


def add_rules(store: RuleStore, n: int) -> None:
    """A mix like a busy fleet's: mostly remembered per run or agent, some policy, a few globs."""
    for i in range(n):
        kind = i % 10
        body: dict = {"effect": "deny" if i % 17 == 0 else "allow", "tool": TOOLS[i % len(TOOLS)]}
        if kind < 6:
            body["run_id"] = f"run_{i}"
        elif kind < 9:
            body["agent"] = AGENTS[i % len(AGENTS)]
            body["args"] = {"amount": {"le": i}, "customer.tier": {"in": ["gold", "silver"]}}
        elif i % 20 == 9:
            body["tool"] = f"fs_{i}_*"
        else:
            body["args"] = {"path": {"prefix": f"/srv/{i}/"}}
        store.create(parse_body(body), created_by="bench")


def create_block(broker: Broker, store: RuleStore, n: int) -> tuple[float, float]:
    """(seconds for n creates of `refund` calls, seconds of it spent matching)."""
    match_s = 0.0
    start = time.perf_counter()
    for i in range(n):
        args = {"amount": 180.0 + i % 7, "customer": {"tier": "bronze"}, "order_id": f"A-{i}"}
        t = time.perf_counter()
        store.match(Call("refund", args, run_id=f"run_x{i % 50}", agent="agent_3"))
        match_s += time.perf_counter() - t
        broker.create_request(NewRequest(tool_name="refund", args=args, prompt="Refund?"))
    return time.perf_counter() - start, match_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=3000, help="creates per measurement")
    parser.add_argument("--rules", type=int, default=1000)
    args = parser.parse_args()
    config = parse_config(
        {"agents": {a: {"path": "bench.mod:agent"} for a in AGENTS}, "queues": {"default": {}}}
    )
    with tempfile.TemporaryDirectory() as tmp, EmbeddedRedis(tmp) as server:
        redis = Redis.from_url(server.url)
        broker = Broker(redis, config)
        empty = RuleStore(redis, config, prefix="none:")
        full = RuleStore(redis, config, prefix="many:")
        add_rules(full, args.rules)
        t = time.perf_counter()
        full.match(Call("refund", {}, run_id="run_x0", agent="agent_3"))
        reread_ms = (time.perf_counter() - t) * 1e3
        active = len(full.list(active=True, limit=10_000))
        print(f"embedded Redis at {server.url}, {args.n} creates each, interleaved", flush=True)
        create_block(broker, empty, 300)  # warm up
        totals = {"none": [0.0, 0.0], "many": [0.0, 0.0]}
        block = 250
        for _ in range(max(1, args.n // block)):  # interleaved, so machine noise hits both
            for name, store in (("none", empty), ("many", full)):
                spent, matching = create_block(broker, store, block)
                totals[name][0] += spent
                totals[name][1] += matching
        n = max(1, args.n // block) * block
        (none_s, none_m), (many_s, many_m) = totals["none"], totals["many"]
        ratio = none_s / many_s * 100
        print(f"{'matching per create, 0 rules':<42}: {none_m / n * 1e6:8.1f} µs")
        print(f"{f'matching per create, {active:,} rules':<42}: {many_m / n * 1e6:8.1f} µs")
        print(
            f"re-read after a change, {active:,} rules    : {reread_ms:8.1f} ms (once per change)"
        )
        print(f"{'creates/s with matching, 0 rules':<42}: {n / none_s:8,.0f} /s")
        print(f"{f'creates/s with matching, {active:,} rules':<42}: {n / many_s:8,.0f} /s")
        verdict = "met" if ratio >= 80 else "NOT met"
        print(f"{f'ratio, {active:,} rules / 0 (target >= 80%)':<42}: {ratio:8.1f} %  {verdict}")


if __name__ == "__main__":
    main()
