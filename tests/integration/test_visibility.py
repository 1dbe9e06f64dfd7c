"""Each principal sees only what is theirs: list, GET (with and without ?wait), POST /wait and
the inbox's data calls answer the same `may_see` rule; lists page with a `Link` header."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from redis import Redis

from api.app import create_app
from broker.domain.config import Config
from broker.domain.models import NewRequest
from broker.domain.settings import Settings
from broker.facade import Broker
from tests.support.auth import person

ADMIN = "tok-admin-0123456789abcdefghij"
ROLES = {"fin": ["finance"], "ops": ["ops"], "svc": ["requester"], "svc2": ["requester"],
         "audit": ["auditor"]}  # fmt: skip


def h(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN if name == 'admin' else 'tok-' + name}"}


API_CONFIG = {
    "queues": {
        "default": {"channels": ["inbox"]},
        "money": {"channels": ["inbox"], "roles": ["finance"]},
    },
    "approvers": {n: person(f"tok-{n}", r) for n, r in ROLES.items()},
}


@pytest.fixture
def setup(redis: Redis, cfg: Config) -> Iterator[tuple[TestClient, dict[str, str]]]:
    broker = Broker(redis, cfg, prefix="t:")
    with TestClient(create_app(Settings(admin_token=ADMIN), cfg, broker)) as client:
        plain = client.post("/v1/requests", json={"tool_name": "a"}, headers=h("svc"))
        roles = client.post(
            "/v1/requests",
            json={"tool_name": "b", "allowed_roles": ["finance"]},
            headers=h("svc"),
        )
        [money] = broker.create_requests([NewRequest(tool_name="c", queue="money")])
        ids = {"plain": plain.json()["id"], "roles": roles.json()["id"], "money": money.id}
        yield client, ids


EXPECTED = {  # who sees which
    "ops": {"plain"},  # no finance role: neither the request's nor the queue's
    "svc": {"plain", "roles"},  # its own
    "svc2": set(),  # another agent's token sees none of them
    "fin": {"plain", "roles", "money"},
    "audit": {"plain", "roles", "money"},
    "admin": {"plain", "roles", "money"},
}


@pytest.mark.parametrize("who", sorted(EXPECTED))
def test_every_read_path_shows_only_what_the_principal_may_see(
    setup: tuple[TestClient, dict[str, str]], who: str
) -> None:
    client, ids = setup
    names = {v: k for k, v in ids.items()}
    for query in ("", "?status=pending", "?queue=money", "?status=pending&queue=default"):
        listed = client.get("/v1/requests" + query, headers=h(who))
        assert listed.status_code == 200
        got = {names[r["id"]] for r in listed.json()}
        wanted = {n for n in EXPECTED[who] if query != "?queue=money" or n == "money"}
        if "default" in query:
            wanted.discard("money")
        assert got == wanted, query
    for name, rid in ids.items():
        visible = name in EXPECTED[who]
        one = client.get(f"/v1/requests/{rid}", headers=h(who))
        assert one.status_code == (200 if visible else 404)
        if not visible:
            assert one.json()["error"] == "not_found"
        waited = client.get(f"/v1/requests/{rid}?wait=0.1", headers=h(who))
        assert waited.status_code == (200 if visible else 404)
        many = client.post(
            "/v1/requests/wait", json={"ids": [rid], "timeout_s": 0.1}, headers=h(who)
        )
        assert many.status_code == (200 if visible else 404)


def test_the_inbox_gets_true_pending_counts_per_queue(
    setup: tuple[TestClient, dict[str, str]],
) -> None:
    client, _ = setup
    queues = {q["name"]: q for q in client.get("/v1/queues", headers=h("ops")).json()}
    assert queues["default"]["pending"] == 2
    assert queues["money"]["pending"] == 1


def test_lists_page_with_a_link_header_until_none_is_left(
    setup: tuple[TestClient, dict[str, str]],
) -> None:
    client, ids = setup
    for i in range(5):
        client.post("/v1/requests", json={"tool_name": f"t{i}"}, headers=h("svc"))
    url: str | None = "/v1/requests?status=pending&limit=2"
    seen: list[str] = []
    while url:
        page = client.get(url, headers=h("audit"))
        assert page.status_code == 200 and len(page.json()) <= 2
        seen += [r["id"] for r in page.json()]
        link = page.headers.get("link")
        if link is None:
            assert "x-next-cursor" not in page.headers
            break
        m = re.fullmatch(r'<(/v1/requests\?[^>]*)>; rel="next"', link)
        assert m, link
        assert "status=pending" in m.group(1) and "limit=2" in m.group(1)
        assert m.group(1).endswith("cursor=" + page.headers["x-next-cursor"])
        url = m.group(1)
    assert len(seen) == len(set(seen)) == 8


def test_a_bad_cursor_is_a_422(setup: tuple[TestClient, dict[str, str]]) -> None:
    client, _ = setup
    bad = client.get("/v1/requests?cursor=nope", headers=h("audit"))
    assert bad.status_code == 422 and bad.json()["error"] == "bad_cursor"
    first = client.get("/v1/requests?limit=1", headers=h("audit"))
    other: Any = client.get(
        "/v1/requests?status=approved&cursor=" + first.headers["x-next-cursor"], headers=h("audit")
    )
    assert other.status_code == 422 and other.json()["error"] == "bad_cursor"


def test_a_run_is_seen_by_its_starter_an_auditor_and_the_admin_only(
    setup: tuple[TestClient, dict[str, str]], redis: Redis
) -> None:
    client, _ = setup
    redis.sadd("t:agents", "refunds")
    started = client.post("/v1/runs", json={"agent": "refunds", "prompt": "go"}, headers=h("svc"))
    assert started.status_code == 202, started.text
    run_id = started.json()["run_id"]
    for who in ("svc", "audit", "admin"):
        assert client.get(f"/v1/runs/{run_id}", headers=h(who)).status_code == 200, who
    for who in ("svc2", "fin", "ops"):
        hidden = client.get(f"/v1/runs/{run_id}", headers=h(who))
        assert hidden.status_code == 404 and hidden.json()["error"] == "not_found", who
