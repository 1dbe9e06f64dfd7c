"""`GET /v1/stats` at 10k, 100k and 1M requests: its time stays flat (it reads rollups, never the
requests), and what keeping the rollups costs a create and a decision.

Every request is made by the real create step (`Broker.create_requests`, bulk, 1,000 a call)
on the embedded Redis (`appendfsync everysec`, to make a million in minutes), with a fleet's
mix: 4 queues, 20 tools, 6 creators, some `allowed_roles`; 2% are decided by the real decide
step (approved, or rejected with one of 30 reasons), so the rollups hold outcomes, times and
reasons too. At each size it times `/v1/stats` through the app (FastAPI's TestClient: the
route, the reads, the JSON) for the admin and for an approver of one role, over the last 24
hours, and over 30 days (the day hashes of the 29 days before are copies of today's: as if
each day had the same traffic). Target: under 50 ms at 1M requests.

    uv run python bench/bench_stats.py [--n 1000000] [--calls 50]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi.testclient import TestClient
from redis import Redis

from api.app import create_app
from broker.domain.config import parse_config
from broker.domain.models import Decision, NewRequest, Outcome
from broker.domain.principals import hash_token
from broker.domain.settings import Settings
from broker.facade import Broker
from broker.redis.embedded import EmbeddedRedis

ADMIN = "bench-admin-token-0123456789abcdef"
QUEUES = ("default", "finance", "ops", "managers")
TOOLS = [f"tool_{i}" for i in range(20)]
CREATORS = [None, "svc1", "svc2", "svc3", "alice", "bob"]
ROLES: list[list[str]] = [[], [], ["finance"], ["ops"]]
REASONS = [f"reason number {i}: not within policy" for i in range(30)]
BATCH = 1000
DECIDED_SHARE = 50  # one in 50 decided


def config() -> Any:
    return parse_config(
        {
            "queues": {
                "default": {"channels": ["inbox"], "escalate_to": "managers"},
                "finance": {"channels": ["inbox"], "roles": ["finance"]},
                "ops": {"channels": ["inbox"], "roles": ["ops"]},
                "managers": {"channels": ["inbox"]},
            },
            "approvers": {
                "alice": {"roles": ["finance"], "token_sha256": hash_token("tok-alice")},
                "bob": {"roles": ["ops"], "token_sha256": hash_token("tok-bob")},
                **{f"svc{i}": {"roles": ["requester"]} for i in (1, 2, 3)},
            },
        }
    )


def templates() -> list[NewRequest]:
    """The distinct requests of the mix (a bulk create encodes each once)."""
    out = []
    for i in range(240):
        out.append(
            NewRequest(
                tool_name=TOOLS[i % len(TOOLS)],
                args={"amount": i},
                queue=QUEUES[i % len(QUEUES)],
                allowed_roles=ROLES[(i // 4) % len(ROLES)],
                created_by=CREATORS[i % len(CREATORS)],
            )
        )
    return out


def grow(broker: Broker, have: int, target: int, kinds: list[NewRequest]) -> tuple[float, float]:
    """Create requests up to `target` (deciding one in 50); (creates/s, decisions/s)."""
    created = decided = 0
    create_s = decide_s = 0.0
    i = have
    while i < target:
        n = min(BATCH, target - i)
        news = [kinds[(i + j) % len(kinds)] for j in range(n)]
        start = time.perf_counter()
        made = broker.create_requests(news)
        create_s += time.perf_counter() - start
        created += n
        start = time.perf_counter()
        for k, request in enumerate(made[::DECIDED_SHARE]):
            if k % 3 == 0:
                decision = Decision(outcome=Outcome.rejected, reason=REASONS[k % len(REASONS)])
            else:
                decision = Decision(outcome=Outcome.approved)
            broker.decide(request.id, decision, decided_by=f"person{k % 7}")
            decided += 1
        decide_s += time.perf_counter() - start
        i += n
    return created / create_s, decided / decide_s


def copy_today_back(redis: Redis, broker: Broker, days: int) -> None:
    """The day hashes of the `days` days before today become copies of today's."""
    today = int(time.time() // 86400)
    for day in range(today - days, today):
        for src, dst in ((broker.keys.insights(today), broker.keys.insights(day)),
                         (broker.keys.insights_hours(today), broker.keys.insights_hours(day))):  # fmt: skip
            redis.copy(src, dst, replace=True)


def timed(api: TestClient, token: str, params: dict[str, str], calls: int) -> tuple[float, float]:
    """p50 and p95 of `calls` GET /v1/stats, in ms."""
    headers = {"Authorization": f"Bearer {token}"}
    api.get("/v1/stats", params=params, headers=headers).raise_for_status()  # warm
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        api.get("/v1/stats", params=params, headers=headers).raise_for_status()
        times.append((time.perf_counter() - start) * 1000)
    times.sort()
    return statistics.median(times), times[int(0.95 * (len(times) - 1))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1_000_000, help="requests at the last size")
    parser.add_argument("--calls", type=int, default=50, help="/v1/stats calls per figure")
    args = parser.parse_args()
    sizes = [s for s in (10_000, 100_000, args.n) if s <= args.n]
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedRedis(tmp, fsync="everysec").start()
        try:
            redis = Redis.from_url(server.url)
            broker = Broker(redis, config(), prefix="ab:")
            kinds = templates()
            app = create_app(Settings(admin_token=ADMIN), broker.config, broker)
            now = datetime.now(UTC)
            month = {"since": (now - timedelta(days=30)).isoformat()}
            with TestClient(app) as api:
                have = 0
                for size in sizes:
                    rate, decides = grow(broker, have, size, kinds)
                    have = size
                    copy_today_back(redis, broker, 29)
                    fields = redis.hlen(broker.keys.insights(int(time.time() // 86400)))
                    day_admin = timed(api, ADMIN, {}, args.calls)
                    day_alice = timed(api, "tok-alice", {}, args.calls)
                    month_admin = timed(api, ADMIN, month, args.calls)
                    total = api.get("/v1/stats", headers={"Authorization": f"Bearer {ADMIN}"})
                    assert total.json()["requests"]["total"] >= size  # the figures are there
                    print(
                        f"stats: {size:>9,} requests ({fields:,} fields a day):"
                        f" 24 h admin p50 {day_admin[0]:.1f} ms (p95 {day_admin[1]:.1f}),"
                        f" 24 h approver p50 {day_alice[0]:.1f} ms,"
                        f" 30 days admin p50 {month_admin[0]:.1f} ms (p95 {month_admin[1]:.1f});"
                        f" while growing: {rate:,.0f} creates/s, {decides:,.0f} decisions/s",
                        flush=True,
                    )
            memory = redis.info("memory")["used_memory"] / 1e6
            print(f"stats: Redis memory {memory:,.0f} MB at {sizes[-1]:,} requests")
            redis.close()
        finally:
            server.close()


if __name__ == "__main__":
    main()
