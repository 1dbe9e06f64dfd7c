"""Core broker throughput on the embedded Redis, beside the raw Redis ceiling measured in the same run.

Prints: raw pipelined XADD/s (the ceiling; measured again just before the batched creates, whose
share of both is shown, as this machine's speed drifts), requests created/s, decisions/s, and
Redis memory per pending request; beside each rate, the CPU it cost per operation in this Python
process (all its threads) and in Redis (`INFO cpu`), which a loaded machine changes far less
than the rates.
The bulk create is measured twice: 100 copies of one NewRequest (bench before 2026-12-01) and
100 distinct ones (a real import), so the sharing of work between copies is not mistaken for
the speed of the step. Run: `uv run python bench/bench_core.py [--n 20000] [--audit off]
[--fsync everysec]` (the embedded Redis's default is `always`); the
audit trail is on by default, as in a deployment, and each create or decision appends an entry to
it (a SHA-256 in Redis's Lua), most of a batched create's cost.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from benchlib import raw_xadd_per_s
from redis import Redis

from broker.domain.config import parse_config
from broker.domain.models import Decision, NewRequest
from broker.facade import Broker
from broker.redis.embedded import EmbeddedRedis


def redis_cpu(redis: Redis) -> float:
    info = redis.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


class Meter:
    """Rate, and CPU ms per operation in this process and in Redis, of the last `timed` call."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self.cpu = ""

    def timed(
        self, n: int, threads: int, fn, ops: int | None = None, *, looped: bool = False
    ) -> float:
        """`fn(0)`..`fn(n - 1)` on `threads` threads: a pool task each, or with `looped` each
        thread calling its share in a loop (no future and wake-up per call: in the pool a
        quarter of the GIL time of batched creates went to `Future.set_result`'s notify)."""
        ops = ops or n
        py0, r0 = time.process_time(), redis_cpu(self.redis)
        start = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            if looped:
                shares = [range(t, n, threads) for t in range(threads)]
                list(pool.map(lambda share: [fn(i) for i in share], shares))
            else:
                list(pool.map(fn, range(n)))
        wall = time.perf_counter() - start
        py, red = time.process_time() - py0, redis_cpu(self.redis) - r0
        self.cpu = f"CPU/op: python {py / ops * 1e3:.3f} ms, redis {red / ops * 1e3:.3f} ms"
        return ops / wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=20_000, help="requests per measurement")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=9, help="interleaved rounds (below)")
    parser.add_argument("--audit", choices=["on", "off"], default="on", help="the audit trail")
    parser.add_argument(
        "--fsync", choices=["always", "everysec"], default="always", help="Redis's appendfsync"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, EmbeddedRedis(tmp, fsync=args.fsync) as server:
        redis = Redis.from_url(server.url, max_connections=64)
        broker = Broker(redis, parse_config({"audit": {"enabled": args.audit == "on"}}))
        print(
            f"embedded Redis (appendfsync {args.fsync}), {args.n} requests,"
            f" {args.threads} client threads",
            flush=True,
        )

        ceiling = raw_xadd_per_s(redis, args.n)
        print(f"raw pipelined XADD/s (ceiling) : {ceiling:10,.0f}", flush=True)

        new = NewRequest(
            tool_name="refund",
            args={"order_id": "A-1042", "amount": 180.0, "currency": "EUR"},
            prompt="Refund 180.00 EUR on order A-1042 (customer asked; over the 100 EUR limit).",
            metadata={"customer": "c-17"},
        )
        ids: list[str] = []
        meter = Meter(redis)
        timed = meter.timed
        mem_before = redis.info("memory")["used_memory"]
        single = timed(args.n, 1, lambda _: ids.append(broker.create_request(new).id))
        mem_after = redis.info("memory")["used_memory"]
        print(f"creates/s, 1 thread            : {single:10,.0f}        {meter.cpu}", flush=True)
        threaded = timed(args.n, args.threads, lambda _: ids.append(broker.create_request(new).id))
        print(
            f"creates/s, {args.threads} threads          : {threaded:10,.0f}  ({threaded / ceiling:3.0%})"
            f" {meter.cpu}",
            flush=True,
        )
        beside = raw_xadd_per_s(redis, args.n)  # the machine's speed drifts: again, beside
        print(f"raw pipelined XADD/s, again    : {beside:10,.0f}  (beside the batches)", flush=True)
        batch = [new] * 100
        batched = timed(
            args.n // 100,
            args.threads,
            lambda _: ids.extend(r.id for r in broker.create_requests(batch)),
            ops=args.n // 100 * 100,
        )
        print(
            f"creates/s, batches of 100      : {batched:10,.0f}  ({batched / ceiling:3.0%};"
            f" {batched / beside:3.0%} of the ceiling beside it) {meter.cpu}",
            flush=True,
        )
        distinct = [
            [
                new.model_copy(update={"args": {**new.args, "order_id": f"A-{b}-{i}"}})
                for i in range(100)
            ]
            for b in range(args.n // 100)
        ]
        mixed = timed(
            args.n // 100,
            args.threads,
            lambda b: ids.extend(r.id for r in broker.create_requests(distinct[b])),
            ops=args.n // 100 * 100,
        )
        print(
            f"  ... 100 distinct requests    : {mixed:10,.0f}  ({mixed / ceiling:3.0%};"
            f" {mixed / beside:3.0%} of the ceiling beside it) {meter.cpu}",
            flush=True,
        )
        interleaved(redis, broker, meter, args, new)
        per_request = (mem_after - mem_before) / args.n
        print(
            f"Redis memory per pending request: {per_request:10,.0f} bytes (hash, expiry and index entries, stream entry)"
        )

        decision = Decision(outcome="approved")
        decided = timed(
            len(ids) // 2,
            args.threads,
            lambda i: broker.decide(ids[i], decision, decided_by="bench"),
        )
        print(f"decisions/s, {args.threads} threads        : {decided:10,.0f}        {meter.cpu}")


def interleaved(redis: Redis, broker: Broker, meter: Meter, args, new: NewRequest) -> None:
    """Batched creates as a share of the ceiling measured right before and right after them,
    over `--rounds` short rounds: each round's share is taken at one machine speed, and the
    median of the rounds is the figure (the single measurements above drift with the machine,
    whose speed moves by a third within seconds). Each thread runs its share of the batches in
    a loop (`Meter.timed(looped=True)`), as the ceiling's client runs its pipelines. Every
    batch is made before the first round and this process's heap is then frozen
    (`gc.freeze`), so that neither the ceiling's client nor the creating threads spend their
    time collecting garbage over what the bench holds; the Requests each create returns are
    dropped at once, as by a caller that needs only their ids."""
    n = max(100, args.n // 4 // 100 * 100)
    copies = [[new] * 100] * (n // 100)
    distinct = [
        [
            [
                new.model_copy(update={"args": {**new.args, "order_id": f"I-{k}-{b}-{i}"}})
                for i in range(100)
            ]
            for b in range(n // 100)
        ]
        for k in range(args.rounds)
    ]
    gc.collect()
    gc.freeze()
    shares: dict[str, list[float]] = {"copies": [], "distinct": []}
    for k in range(args.rounds):
        for kind, batches in (("copies", copies), ("distinct", distinct[k])):
            before = raw_xadd_per_s(redis, n)
            rate = meter.timed(
                n // 100,
                args.threads,
                lambda b, batches=batches: len(broker.create_requests(batches[b])),
                ops=n,
                looped=True,
            )
            after = raw_xadd_per_s(redis, n)
            shares[kind].append(rate / ((before + after) / 2))
            print(
                f"  round {k} {kind:8}: {rate:7,.0f}/s between ceilings of {before:,.0f} and"
                f" {after:,.0f}/s  {meter.cpu}",
                flush=True,
            )
    gc.unfreeze()
    for kind, values in shares.items():
        ordered = sorted(values)
        print(
            f"interleaved {kind:8}, {args.rounds} rounds : {statistics.median(values):4.0%} of the"
            f" ceiling beside each (median; {ordered[0]:.0%}-{ordered[-1]:.0%})",
            flush=True,
        )


if __name__ == "__main__":
    main()
