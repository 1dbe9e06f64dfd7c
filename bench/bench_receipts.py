"""The cost of approval receipts per decision: signing and checking time, Redis memory.

Prints (never asserts):
- µs per receipt signed (`Receipts.stamp`) and per receipt verified (`Receipts.verify`), in
  this process, without Redis;
- µs per decision through `Broker.decide` with receipts off and on (the same requests, one
  decide.lua step each; on adds the signing and the token in the stored decision);
- µs per check at execution (`ReceiptChecks.spend`: verify plus receipt.lua);
- Redis memory per decided request (MEMORY USAGE of its hash) without and with a receipt, and
  per spent jti marker.

    uv run python bench/bench_receipts.py [--n 2000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from redis import Redis

from broker.domain.config import parse_config
from broker.domain.models import Decision, NewRequest
from broker.domain.receipts import CallFacts, ReceiptKeys, Receipts, new_key_pem
from broker.facade import Broker
from broker.receipts.checks import ReceiptChecks
from broker.redis.embedded import EmbeddedRedis

ARGS = {"order_id": "A103", "amount": 120, "reason": "the tent arrived torn"}


def per_us(started: float, n: int) -> float:
    return (time.perf_counter() - started) / n * 1e6


def sign_and_verify(receipts: Receipts, n: int) -> tuple[float, float]:
    call = CallFacts("req_1", "issue_refund", "call_1", "run_1", ARGS)
    approved = Decision(outcome="approved")
    started = time.perf_counter()
    tokens = [receipts.stamp(call, approved, decided_by="alice").receipt for _ in range(n)]
    signing = per_us(started, n)
    started = time.perf_counter()
    for token in tokens:
        receipts.verify(token, request_id="req_1", tool_name="issue_refund", args=ARGS)
    return signing, per_us(started, n)


def decide_all(broker: Broker, n: int) -> tuple[float, list[str]]:
    made = broker.create_requests([NewRequest(tool_name="issue_refund", args=ARGS)] * n)
    ids = [r.id for r in made]
    started = time.perf_counter()
    for request in made:
        broker.decide(request.id, Decision(outcome="approved"), decided_by="alice", request=request)
    return per_us(started, n), ids


def memory(redis: Redis, keys: list[str]) -> float:
    return sum(redis.memory_usage(k) or 0 for k in keys) / len(keys)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, EmbeddedRedis(tmp) as server:
        key = Path(tmp) / "receipts.pem"
        key.write_bytes(new_key_pem())
        receipts = Receipts(ReceiptKeys.load(key))
        signing, verifying = sign_and_verify(receipts, args.n)
        redis = Redis.from_url(server.url)
        off = Broker(redis, parse_config({}), prefix="off:")
        on = Broker(redis, parse_config({"receipts": {"key_file": str(key)}}), prefix="on:")
        off_us, off_ids = decide_all(off, args.n)
        on_us, on_ids = decide_all(on, args.n)
        mem_off = memory(redis, [off.keys.request(i) for i in off_ids])
        mem_on = memory(redis, [on.keys.request(i) for i in on_ids])
        checks = ReceiptChecks(on)
        started = time.perf_counter()
        for request in on.get_requests(on_ids):
            checks.spend(request, tool_name="issue_refund", args=ARGS)
        spend_us = per_us(started, args.n)
        mem_spent = memory(redis, [on.keys.request(i) for i in on_ids])
        markers = [k.decode() for k in redis.scan_iter(match="on:spent:*", count=1000)]
        mem_marker = memory(redis, markers) if markers else 0.0
        print(f"receipts, n={args.n} (bench/bench_receipts.py)")
        print(f"  sign one receipt                      {signing:8.1f} µs")
        print(f"  verify one receipt                    {verifying:8.1f} µs")
        print(f"  decide (Broker.decide), receipts off  {off_us:8.1f} µs")
        print(f"  decide (Broker.decide), receipts on   {on_us:8.1f} µs")
        print(f"  check at execution (verify + spend)   {spend_us:8.1f} µs")
        print(f"  Redis per decided request, off        {mem_off:8.0f} bytes")
        print(f"  Redis per decided request, on         {mem_on:8.0f} bytes")
        print(f"  Redis per request, on, once spent     {mem_spent:8.0f} bytes (history entry)")
        print(f"  Redis per spent jti marker            {mem_marker:8.0f} bytes")


if __name__ == "__main__":
    main()
