"""GET /v1/stats against a seeded history on a real Redis: exact counts and percentiles from the
rollups the Lua steps keep (created, decided by people, by a rule at create, timed out,
escalated, routed), each principal seeing the figures of exactly the requests it may read,
and a bad window refused with 422."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from redis import Redis

from api.app import create_app
from broker.domain.config import parse_config
from broker.domain.models import Decision, NewRequest, Outcome, Request
from broker.domain.rules.models import parse_body
from broker.domain.settings import Settings
from broker.facade import Broker
from tests.support.auth import bearer, person

ADMIN = "tok-admin-stats-0123456789abcdef"
ROLES = {"fin": ["finance"], "ops": ["ops"], "svc": ["requester"], "audit": ["auditor"]}
CONFIG = {
    "queues": {
        "default": {"channels": ["inbox"], "timeout_s": 600, "escalate_to": "money"},
        "money": {"channels": ["inbox"], "roles": ["finance"], "timeout_s": 900},
    },
    "approvers": {n: person(f"tok-{n}", r) for n, r in ROLES.items()},
}


def h(name: str) -> dict[str, str]:
    return bearer(ADMIN if name == "admin" else f"tok-{name}")


@pytest.fixture
def broker(redis: Redis) -> Broker:
    return Broker(redis, parse_config(CONFIG), prefix="t:")


@pytest.fixture
def api(broker: Broker) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(admin_token=ADMIN), broker.config, broker)) as client:
        yield client


AHEAD = {"until": (datetime.now(UTC) + timedelta(hours=2)).isoformat()}
"""A window reaching past the sweep the seed simulates (30 s ahead), whatever the hour."""


def waited(broker: Broker, request: Request, seconds: float) -> None:
    """Seed: the request was made `seconds` ago (on Redis's clock), so deciding it now records
    that long a wait."""
    now, micros = broker.redis.time()
    created = now + micros / 1e6 - seconds
    broker.redis.hset(broker.keys.request(request.id), "created_at", f"{created:.6f}")


def decide(broker: Broker, request: Request, outcome: Outcome, by: str, **more: Any) -> None:
    broker.decide(request.id, Decision(outcome=outcome, **more), decided_by=by)


def seed(broker: Broker) -> dict[str, Request]:
    """A known history: 5 approved by people in `default` (waits 3, 4, 20, 50, 100 s), 2 in
    `money` (700 and 1000 s), 2 rejected in `default` with one reason (200 and 400 s), a rule's allow at create,
    a routed one, an escalated one, a timed-out one; creators and roles vary."""
    rules = broker.requests.rules
    rules.create(parse_body({"id": "auto", "effect": "allow", "tool": "ping"}), created_by="pat")
    rules.create(
        parse_body(
            {
                "id": "big",
                "effect": "route",
                "tool": "pay",
                "args": {"amount": {"gt": 500}},
                "route": {"queue": "money", "quorum": 2, "risk": "high"},
            }
        ),  # fmt: skip
        created_by="pat",
    )
    made = {}
    for name, new in {
        "a": NewRequest(tool_name="refund", created_by="svc"),
        "b": NewRequest(tool_name="refund", created_by="svc"),
        "c": NewRequest(tool_name="refund"),
        "d": NewRequest(tool_name="ship", allowed_roles=["finance"], created_by="svc"),
        "e": NewRequest(tool_name="ship"),
        "m1": NewRequest(tool_name="pay", queue="money", args={"amount": 10}),
        "m2": NewRequest(tool_name="pay", queue="money", args={"amount": 20}),
        "r1": NewRequest(tool_name="refund", created_by="svc"),
        "r2": NewRequest(tool_name="ship"),
        "ruled": NewRequest(tool_name="ping"),
        "routed": NewRequest(tool_name="pay", args={"amount": 900}),
        "late": NewRequest(tool_name="wait", queue="money", timeout_s=1),
        "up": NewRequest(tool_name="refund"),
    }.items():
        [made[name]] = broker.create_requests([new])
    waits = {
        "a": 3,
        "b": 4,
        "c": 20,
        "d": 50,
        "e": 100,
        "m1": 700,
        "m2": 1000,
        "r1": 200,
        "r2": 400,
    }
    for name, seconds in waits.items():
        waited(broker, made[name], seconds)
    for name in ("a", "b", "c", "d", "e", "m1", "m2"):
        decide(broker, made[name], Outcome.approved, "fin")
    decide(broker, made["r1"], Outcome.rejected, "ops", reason="too much")
    decide(broker, made["r2"], Outcome.rejected, "fin", reason="too much")
    broker.escalate(made["up"].id, "money", decided_by="ops")
    far = datetime.now(UTC) + timedelta(seconds=30)
    [timed] = [r for r in broker.sweep(now=far.timestamp()) if r.request_id == made["late"].id]
    assert timed.action == "timed_out"
    return made


def test_counts_and_percentiles_of_a_seeded_history_are_exact(
    broker: Broker, api: TestClient
) -> None:
    made = seed(broker)
    assert broker.get_request(made["routed"].id).queue == "money"
    got = api.get("/v1/stats", params=AHEAD, headers=h("admin"))
    assert got.status_code == 200, got.text
    body = got.json()
    assert set(body) >= {"since", "until", "requests", "decided_by", "time_to_decision_s",
                         "escalations", "rule_hits"}  # fmt: skip
    requests = body["requests"]
    assert requests["total"] == 13
    assert requests["by_queue"] == {"default": 9, "money": 4}  # `routed` counts where it went
    assert requests["by_tool"] == {"refund": 5, "pay": 3, "ship": 3, "ping": 1, "wait": 1}
    assert requests["by_outcome"] == {"approved": 8, "rejected": 2, "timed_out": 1}
    assert body["decided_by"] == {"person": 9, "rule": 1, "timeout": 1}
    assert body["escalations"] == 1
    assert body["rule_hits"] == {"auto": 1, "big": 1}
    assert body["reject_reasons"] == [{"reason": "too much", "count": 2}]
    # default, 7 waits by bucket: <=5 s: 2 (3, 4), <=30: 1, <=60: 1, <=120: 1, <=300: 1,
    # <=600: 1. As histogram_quantile: p50 (rank 3.5) = 30 + 30 * 0.5 / 1 = 45,
    # p90 (rank 6.3) = 300 + 300 * 0.3 / 1 = 390
    ttd = body["time_to_decision_s"]
    assert ttd["by_queue"]["default"] == {"p50": 45.0, "p90": 390.0}
    # money: 700 and 1000 (<= 1800): p50 = 600 + 1200 * 1 / 2, p90 = 600 + 1200 * 1.8 / 2
    assert ttd["by_queue"]["money"] == {"p50": 1200.0, "p90": 1680.0}
    # all 9: p50 (rank 4.5) = 60 + 60 * 0.5 / 1 = 90, p90 (rank 8.1) = 600 + 1200 * 1.1 / 2
    assert ttd["p50"] == 90.0 and ttd["p90"] == 1260.0
    assert body["by_approver"] == {"fin": 8, "ops": 1}


EXPECTED_TOTALS = {  # created requests each principal may see (see the seed)
    "admin": 13,
    "audit": 13,
    "fin": 13,  # finance: the `money` queue and `d` (allowed_roles finance) too
    "ops": 8,  # neither `money` (4) nor `d`: default's other eight
    "svc": 4,  # only what it created: a, b, d, r1
}


@pytest.mark.parametrize("who", sorted(EXPECTED_TOTALS))
def test_each_principal_counts_only_what_it_may_read(
    broker: Broker, api: TestClient, who: str
) -> None:
    seed(broker)
    body = api.get("/v1/stats", params=AHEAD, headers=h(who)).json()
    assert body["requests"]["total"] == EXPECTED_TOTALS[who]
    listed = api.get("/v1/requests", params={"limit": 100}, headers=h(who)).json()
    # the same rule as the reads; each event counts where the request was then: `up`, made
    # in default, now waits in money, which ops may not read
    assert len(listed) == EXPECTED_TOTALS[who] - (who == "ops")
    if who in ("admin", "audit"):
        assert body["by_approver"] == {"fin": 8, "ops": 1}
    else:
        assert body["by_approver"] is None
    if who == "ops":
        assert "money" not in body["requests"]["by_queue"]
        assert body["rule_hits"] == {"auto": 1}  # the routed one waits in money
        assert body["reject_reasons"] == [{"reason": "too much", "count": 2}]
    if who == "svc":
        assert body["requests"]["by_outcome"] == {"approved": 3, "rejected": 1}
        assert body["reject_reasons"] == [{"reason": "too much", "count": 1}]


def test_a_window_in_the_past_counts_nothing_and_the_window_is_whole_hours(
    broker: Broker, api: TestClient
) -> None:
    seed(broker)
    now = datetime.now(UTC)
    old = api.get(
        "/v1/stats",
        params={"since": (now - timedelta(days=3)).isoformat(),
                "until": (now - timedelta(days=2)).isoformat()},
        headers=h("admin"),
    ).json()  # fmt: skip
    assert old["requests"]["total"] == 0 and old["decided_by"]["person"] == 0
    assert old["time_to_decision_s"]["p50"] is None
    since = datetime.fromisoformat(old["since"])
    assert since.minute == since.second == 0
    week = api.get(
        "/v1/stats", params={"since": (now - timedelta(days=7)).date().isoformat(), **AHEAD},
        headers=h("admin"),
    ).json()  # fmt: skip
    assert week["requests"]["total"] == 13  # whole days from the day hashes, today by the hour


@pytest.mark.parametrize(
    ("params", "says"),
    [
        ({"since": "yesterday"}, "since: 'yesterday' is not an ISO 8601 time"),
        ({"since": "2026-12-02T00:00:00Z", "until": "2026-12-01T00:00:00Z"}, "before until"),
        ({"since": "2025-01-01T00:00:00Z", "until": "2026-12-01T00:00:00Z"}, "at most 366 days"),
        ({"until": "2026-13-01"}, "until: '2026-13-01' is not an ISO 8601 time"),
        ({"since": "9999-12-30T00:00:00Z", "until": "9999-12-31T23:30:00Z"}, "between 1970 and"),
        ({"since": "0001-01-01", "until": "0001-01-02"}, "since: must be between 1970 and 9998"),
    ],
)
def test_a_bad_window_is_a_422_that_says_why(
    api: TestClient, params: dict[str, str], says: str
) -> None:
    got = api.get("/v1/stats", params=params, headers=h("admin"))
    assert got.status_code == 422, got.text
    assert got.json()["error"] == "invalid_window" and says in got.json()["detail"]


def test_stats_need_a_token(api: TestClient) -> None:
    assert api.get("/v1/stats").status_code == 401


def test_the_stats_command_prints_the_same_figures(
    broker: Broker, redis_url: str, tmp_config
) -> None:
    from typer.testing import CliRunner

    from approval_broker.cli import app as cli_app

    seed(broker)
    toml = '[queues.default]\nescalate_to = "money"\n[queues.money]\n'
    env = {
        "APPROVAL_BROKER_REDIS_URL": redis_url,
        "APPROVAL_BROKER_KEY_PREFIX": "t:",
        "APPROVAL_BROKER_CONFIG": str(tmp_config(toml)),
    }
    out = CliRunner().invoke(cli_app, ["stats", "--until", AHEAD["until"]], env=env)
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert "requests created: 13" in lines
    assert "  by queue: default 9, money 4" in lines
    assert "decided by: person 9, rule 1, timeout 1" in lines
    assert "time to decision: p50 90 s, p90 21.0 min" in lines
    assert "  default: p50 45 s, p90 6.5 min" in lines
    assert "escalations: 1" in lines and "rule hits: auto 1, big 1" in lines
    assert "      2  too much" in lines and "answers per approver: fin 8, ops 1" in lines
    as_json = CliRunner().invoke(cli_app, ["stats", "--json", "--until", AHEAD["until"]], env=env)
    api_body = (
        TestClient(create_app(Settings(admin_token=ADMIN), broker.config, broker))
        .get("/v1/stats", params=AHEAD, headers=h("admin"))
        .json()
    )
    cli_body = json.loads(as_json.output)
    assert {k: v for k, v in cli_body.items() if k not in ("since", "until")} == {
        k: v for k, v in api_body.items() if k not in ("since", "until")
    }
    bad = CliRunner().invoke(
        cli_app, ["stats", "--since", "2026-12-02", "--until", "2026-12-01"], env=env
    )
    assert bad.exit_code == 1 and bad.output.strip() == "error: since: must be before until"


def test_the_client_package_reads_the_stats_as_its_wire_model(broker: Broker) -> None:
    import asyncio

    from approval_broker_client import AsyncRemoteBroker, InvalidInput, RemoteBroker, Stats

    from api.testing import ServerThread

    seed(broker)
    app = create_app(Settings(admin_token=ADMIN), broker.config, broker)
    with ServerThread(app) as server, RemoteBroker(server.url, "tok-svc") as svc:
        mine = svc.stats(until=AHEAD["until"])
        assert isinstance(mine, Stats) and mine.requests.total == EXPECTED_TOTALS["svc"]
        assert mine.by_approver is None and mine.reject_reasons[0].reason == "too much"
        with pytest.raises(InvalidInput, match="before until"):
            svc.stats(since="2026-12-02", until="2026-12-01")

        async def every() -> Stats:
            async with AsyncRemoteBroker(server.url, ADMIN) as admin:
                return await admin.stats(until=AHEAD["until"])

        admin = asyncio.run(every())
        assert admin.requests.total == 13 and admin.time_to_decision_s.by_queue["money"].p50 == 1200
