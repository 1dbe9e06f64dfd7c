"""Real creates/s with policy rules wired in: 0 vs 1,000 active rules, on the embedded Redis.

Each create is `Broker.create_round` of one approval call in a run, as a worker registers a
round: the run's agent is read (once per run and process), the call is matched against the
cached, indexed rules of its tool, its suggested rules are built, and create.lua runs, checking
the rules' version the match used (no read of its own before the step). The
1,000 rules are a busy fleet's mix (per run, per agent, policy, globs) that cover none of the
measured calls, so both sides do the same Redis work and the difference is the cost of rules.
Also prints creates/s where a rule decides every call at create, and the one-off re-read after
a rule changes. Target: creates/s with 1,000 rules >= 80% of those with none.

    uv run python bench/bench_rules.py [--n 3000] [--rules 1000]
"""

from __future__ import annotations

import argparse
import tempfile
import time

from redis import Redis

from broker.domain.config import parse_config
from broker.domain.models import NewRequest
from broker.domain.rules.matching import Call
from broker.domain.rules.models import parse_body
from broker.facade import Broker
from broker.redis.embedded import EmbeddedRedis

TOOLS = [f"tool_{i}" for i in range(30)] + ["refund"]
AGENTS = [f"agent_{i}" for i in range(10)]
RUNS = 50


def add_rules(broker: Broker, n: int) -> None:
    """Mostly remembered per run or agent, some policy, a few globs; none covers a bronze call."""
    store = broker.requests.rules
    for i in range(n):
        kind = i % 10
        tool = TOOLS[i % len(TOOLS)]
        body: dict = {"effect": "deny" if i % 17 == 0 else "allow", "tool": tool}
        if kind < 6:
            body["run_id"] = f"run_b{i % RUNS}"
        elif kind < 9:
            body["agent"] = AGENTS[i % len(AGENTS)]
            body["args"] = {"amount": {"le": i}}
        elif i % 20 == 9:
            body["tool"] = f"fs_{i}_*"
        else:
            body["args"] = {"path": {"prefix": f"/srv/{i}/"}}
        if tool == "refund":  # the measured tool: scoped so that a bronze customer never matches
            body["args"] = {**body.get("args", {}), "customer.tier": {"in": ["gold", "silver"]}}
        store.create(parse_body(body), created_by="bench")


def make_runs(broker: Broker) -> list[str]:
    return [broker.create_run("agent_3", "bench", run_id=f"run_b{i}").id for i in range(RUNS)]


class Rounds:
    """Creates one-call rounds across the runs, each a fresh round number."""

    def __init__(self, broker: Broker, tier: str = "bronze") -> None:
        self.broker = broker
        self.runs = make_runs(broker)
        self.tier = tier
        self.next_round = 1

    def block(self, n: int) -> float:
        """Seconds for n creates."""
        start = time.perf_counter()
        for i in range(n):
            run_id = self.runs[i % RUNS]
            args = {"amount": 180.0 + i % 7, "customer": {"tier": self.tier}, "order_id": f"A-{i}"}
            self.broker.create_round(
                run_id, self.next_round, [NewRequest(tool_name="refund", args=args, prompt="?")]
            )
            if i % RUNS == RUNS - 1:
                self.next_round += 1
        self.next_round += 1
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=3000, help="creates per measurement")
    parser.add_argument("--rules", type=int, default=1000)
    args = parser.parse_args()
    config = parse_config(
        {"agents": {a: {"path": "bench.mod:agent"} for a in AGENTS}, "queues": {"default": {}}}
    )
    with tempfile.TemporaryDirectory() as tmp, EmbeddedRedis(tmp) as server:
        redis = Redis.from_url(server.url)
        none = Broker(redis, config, prefix="none:")
        many = Broker(redis, config, prefix="many:")
        ruled = Broker(redis, config, prefix="ruled:")
        add_rules(many, args.rules)
        ruled.requests.rules.create(
            parse_body({"effect": "allow", "tool": "refund", "agent": "agent_3"}), created_by="b"
        )
        rounds = {"none": Rounds(none), "many": Rounds(many), "ruled": Rounds(ruled)}
        t = time.perf_counter()
        many.requests.rules.match(Call("refund", {}, run_id="run_b0", agent="agent_3"))
        reread_ms = (time.perf_counter() - t) * 1e3
        active = len(many.requests.rules.list(active=True, limit=100_000))
        print(f"embedded Redis, {args.n} creates each, interleaved", flush=True)
        for r in rounds.values():
            r.block(200)  # warm up
        totals = dict.fromkeys(rounds, 0.0)
        block = 250
        blocks = max(1, args.n // block)
        for _ in range(blocks):  # interleaved, so machine noise hits each alike
            for name, r in rounds.items():
                totals[name] += r.block(block)
        n = blocks * block
        hits = ruled.requests.rules.list()[0].hits
        ratio = totals["none"] / totals["many"] * 100
        print(f"{'re-read after a rule changes':<44}: {reread_ms:8.1f} ms (once per change)")
        print(f"{'creates/s, 0 rules':<44}: {n / totals['none']:8,.0f} /s")
        print(f"{f'creates/s, {active:,} rules (none covers the call)':<44}: {n / totals['many']:8,.0f} /s")  # fmt: skip
        print(f"{'creates/s, a rule decides each at create':<44}: {n / totals['ruled']:8,.0f} /s  ({hits:,} hits)")  # fmt: skip
        verdict = "met" if ratio >= 80 else "NOT met"
        print(f"{f'ratio, {active:,} rules / 0 (target >= 80%)':<44}: {ratio:8.1f} %  {verdict}")


if __name__ == "__main__":
    main()
