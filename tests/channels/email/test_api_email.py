"""Email links: GET only shows, POST decides once; used, expired and forged links get a page and a 4xx."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from itsdangerous import TimestampSigner
from redis import Redis

from api.app import create_app
from broker.domain.config import Config, parse_config
from broker.domain.models import Decision, NewRequest, Outcome, Request
from broker.domain.settings import Settings
from broker.facade import Broker
from channels.email.links import new_nonce, read_link, sign_link
from tests.support.backends import on_backend, on_backend_api_broker, on_backend_broker  # noqa: F401 - redis, broker, api_broker on both backends
from tests.support.email_links import link, page_error  # noqa: F401

API_CONFIG = {
    "queues": {"default": {"channels": ["email:leads"]}},
    "email": {
        "public_url": "http://testserver",
        "link_ttl_s": 3600,
        "lists": {
            "leads": {
                "to": ["alice@example.com", "stranger@example.com"],
                "unmapped_may_decide": True,
            }
        },
    },
    "approvers": {"alice": {"roles": ["finance"], "email": "Alice@Example.com"}},
}


def make(broker: Broker, **kw: Any) -> Request:
    kw.setdefault("tool_name", "refund")
    kw.setdefault("args", {"order_id": "A1", "amount": 120})
    return broker.create_request(NewRequest(**kw))


def test_get_shows_the_request_and_changes_nothing(client: TestClient, api_broker: Broker) -> None:
    req = make(api_broker, prompt="Refund <b>A1</b>?")
    url = link(api_broker, req, "approve")
    for _ in range(2):  # a mail scanner and then the person
        resp = client.get(url)
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/html")
        assert "refund" in resp.text and "&#34;amount&#34;: 120" in resp.text
        assert "Refund &lt;b&gt;A1&lt;/b&gt;?" in resp.text  # escaped
        assert '<form method="post">' in resp.text
    assert api_broker.get_request(req.id).is_pending
    done = client.post(url, data={"args_hash": req.args_hash})
    assert done.status_code == 200 and "approved" in done.text
    stored = api_broker.get_request(req.id)
    assert stored.status.value == "approved" and stored.decision is not None
    assert stored.decision.decided_by == "alice"  # email matched case-insensitively


def test_link_used_twice_is_410(client: TestClient, api_broker: Broker) -> None:
    req = make(api_broker)
    nonce = new_nonce()
    approve = link(api_broker, req, "approve", nonce=nonce)
    reject = link(api_broker, req, "reject", nonce=nonce)  # the same mail's other button
    assert client.post(approve).status_code == 200
    page_error(client.post(approve), 410, "link_used")
    page_error(client.get(approve), 410, "link_used")
    page_error(client.post(reject, data={"reason": "no"}), 410, "link_used")
    assert api_broker.get_request(req.id).status.value == "approved"


def test_expired_link_is_410(
    client: TestClient, api_broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    req = make(api_broker)
    with monkeypatch.context() as m:
        m.setattr(TimestampSigner, "get_timestamp", lambda self: int(time.time()) - 7200)
        url = link(api_broker, req, "approve")
    page_error(client.get(url), 410, "link_expired")
    page_error(client.post(url), 410, "link_expired")
    assert api_broker.get_request(req.id).is_pending


@pytest.mark.parametrize("forge", ["garbage", "tamper", "other-secret"])
def test_forged_link_is_403(client: TestClient, api_broker: Broker, forge: str) -> None:
    req = make(api_broker)
    url = link(api_broker, req, "approve")
    if forge == "garbage":
        url = "/v1/email/eyJyIjoiLi4uIn0.not.valid"
    elif forge == "tamper":
        url = url[:-3] + ("AAA" if not url.endswith("AAA") else "BBB")
    else:
        other = Broker(api_broker.redis, api_broker.config, prefix="other:")
        url = link(other, req, "approve")
    page_error(client.get(url), 403, "link_invalid")
    page_error(client.post(url), 403, "link_invalid")
    assert api_broker.get_request(req.id).is_pending


def test_reject_with_reason_and_answer_a_question(client: TestClient, api_broker: Broker) -> None:
    req = make(api_broker)
    url = link(api_broker, req, "reject")
    assert "<textarea" in client.get(url).text
    assert client.post(url, data={"reason": " too much "}).status_code == 200
    stored = api_broker.get_request(req.id)
    assert stored.status.value == "rejected" and stored.decision.reason == "too much"  # type: ignore[union-attr]
    q = make(api_broker, kind="question", metadata={"options": ["red", "blue"]})
    url = link(api_broker, q, "answer")
    shown = client.get(url).text
    assert 'name="answer"' in shown and '<option value="blue">' in shown
    page_error(client.post(url, data={"answer": "   "}), 422, "invalid")  # not spent:
    assert client.post(url, data={"answer": "blue"}).status_code == 200
    assert api_broker.get_request(q.id).decision.answer == "blue"  # type: ignore[union-attr]


def test_recipient_roles_and_unknown_recipients(client: TestClient, api_broker: Broker) -> None:
    finance = make(api_broker, allowed_roles=["finance"])
    stranger_url = link(api_broker, finance, "approve", to="stranger@example.com")
    page_error(client.post(stranger_url), 403, "forbidden")
    assert api_broker.get_request(finance.id).is_pending
    page_error(client.post(stranger_url), 403, "forbidden")  # refused before spending, again
    open_req = make(api_broker)
    assert (
        client.post(link(api_broker, open_req, "approve", to="stranger@example.com")).status_code
        == 200
    )
    decision = api_broker.get_request(open_req.id).decision
    assert decision is not None and decision.decided_by == "email:stranger@example.com"


def test_links_that_cannot_apply(client: TestClient, api_broker: Broker) -> None:
    q = make(api_broker, kind="question")
    page_error(client.post(link(api_broker, q, "approve")), 422, "wrong_kind")
    view = link(api_broker, q, "view")
    assert client.get(view).status_code == 200 and "<form" not in client.get(view).text
    page_error(client.post(view), 422, "invalid")
    req = make(api_broker)
    url = link(api_broker, req, "approve")
    page_error(client.post(url, data={"args_hash": "0" * 64}), 422, "stale_args")
    assert api_broker.get_request(req.id).is_pending
    assert client.post(url).status_code == 200  # the link was not spent by the refusals


def test_already_decided_is_409_and_keeps_the_link(client: TestClient, api_broker: Broker) -> None:
    req = make(api_broker)
    api_broker.decide(req.id, Decision(outcome=Outcome.rejected), decided_by="bob")
    url = link(api_broker, req, "approve")
    page_error(client.get(url), 409, "conflict")
    resp = client.post(url)
    page_error(resp, 409, "conflict")
    assert "bob" in resp.text
    assert api_broker.get_request(req.id).status.value == "rejected"


def test_gone_request_is_404_page(client: TestClient, api_broker: Broker) -> None:
    req = make(api_broker)
    url = link(api_broker, req, "approve")
    api_broker.redis.delete(api_broker.keys.request(req.id))
    page_error(client.get(url), 404, "not_found")


def test_email_not_configured_is_404(redis: Redis) -> None:
    cfg = parse_config({})
    broker = Broker(redis, cfg, prefix="t:")
    req = make(broker)
    with TestClient(create_app(Settings(), cfg, broker)) as c:
        resp = c.get(link(broker, req, "approve"))
        assert resp.status_code == 404 and resp.json()["error"] == "not_configured"


def test_a_link_spent_while_redis_fails_is_given_back(
    client: TestClient, api_broker: Broker, cfg: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spend, then Redis fails before the decision: the link must still work afterwards."""
    from redis.exceptions import ConnectionError as RedisConnectionError

    req = make(api_broker)
    approve = link(api_broker, req, "approve")

    def failing(*args: Any, **kwargs: Any) -> Any:
        raise RedisConnectionError("connection reset")

    monkeypatch.setattr(api_broker.decisions, "decide", failing)
    with TestClient(
        create_app(Settings(admin_token="x"), cfg, api_broker), raise_server_exceptions=False
    ) as c:
        assert c.post(approve).status_code == 503
    assert api_broker.get_request(req.id).is_pending
    monkeypatch.undo()
    assert client.post(approve).status_code == 200
    assert api_broker.get_request(req.id).status.value == "approved"


# ---- escalation links and links bound to a queue ------------------------------------------


@pytest.fixture
def chain() -> Config:
    return parse_config(
        {
            "queues": {
                "default": {"channels": ["email:leads"], "escalate_to": "managers"},
                "managers": {"channels": ["email:bosses"]},
            },
            "email": {
                "public_url": "http://testserver",
                "lists": {
                    "leads": {"to": ["alice@example.com"]},
                    "bosses": {"to": ["boss@example.com"]},
                },
            },
            "approvers": {
                "alice": {"roles": ["finance"], "email": "alice@example.com"},
                "boss": {"roles": ["finance"], "email": "boss@example.com"},
            },
        }
    )


@pytest.fixture
def chained(redis: Redis, chain: Config) -> Iterator[tuple[TestClient, Broker]]:
    broker = Broker(redis, chain, prefix="t:")
    with TestClient(create_app(Settings(), chain, broker)) as c:
        yield c, broker


def bound(broker: Broker, req: Request, action: str, to: str = "alice@example.com") -> str:
    """A link as the notifier mails it: bound to the queue the request is in now."""
    token = sign_link(broker, req.id, to, action, new_nonce(), queue=req.queue)
    return "/v1/email/" + token


def test_escalate_link_moves_the_request_with_an_optional_reason(
    chained: tuple[TestClient, Broker],
) -> None:
    client, broker = chained
    req = make(broker)
    url = bound(broker, req, "escalate")
    shown = client.get(url)
    assert shown.status_code == 200 and "<textarea" in shown.text and "managers" in shown.text
    assert broker.get_request(req.id).queue == "default"  # GET changes nothing
    done = client.post(url, data={"reason": " over my limit ", "args_hash": req.args_hash})
    assert done.status_code == 200 and "Escalated to managers" in done.text
    moved = broker.get_request(req.id)
    assert moved.is_pending and moved.queue == "managers"
    (step,) = [h for h in moved.history if h.event == "escalated"]
    assert (step.by, step.to_queue, step.reason) == ("alice", "managers", "over my limit")
    page_error(client.post(url), 410, "link_used")
    plain = bound(broker, make(broker), "escalate")
    assert client.post(plain).status_code == 200  # the reason is optional


def test_a_link_from_before_an_escalation_no_longer_decides(
    chained: tuple[TestClient, Broker],
) -> None:
    client, broker = chained
    req = make(broker)
    approve = bound(broker, req, "approve")
    broker.escalate(req.id, reason="too big", decided_by="sweeper")
    for resp in (client.get(approve), client.post(approve, data={"args_hash": req.args_hash})):
        page_error(resp, 409, "escalated")
        assert "this request was escalated to managers" in resp.text.lower()
    assert broker.get_request(req.id).is_pending
    fresh = bound(broker, broker.get_request(req.id), "approve", to="boss@example.com")
    assert client.post(fresh).status_code == 200  # the new queue's mail decides it
    assert broker.get_request(req.id).status.value == "approved"


def test_escalate_link_where_nothing_follows_is_refused_before_spending(
    chained: tuple[TestClient, Broker],
) -> None:
    client, broker = chained
    req = make(broker, queue="managers")
    url = bound(broker, req, "escalate", to="boss@example.com")
    page_error(client.post(url), 422, "no_target")
    assert broker.get_request(req.id).queue == "managers"
    page_error(client.post(url), 422, "no_target")  # not spent: the same answer again


def test_the_link_secret_is_read_from_redis_once_per_broker(
    api_broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    req = make(api_broker)
    first = sign_link(api_broker, req.id, "alice@example.com", "approve", new_nonce())
    calls: list[str] = []
    for name in ("get", "set"):
        real = getattr(api_broker.redis, name)

        def counted(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            calls.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(api_broker.redis, name, counted)
    for _ in range(3):
        token = sign_link(api_broker, req.id, "alice@example.com", "approve", new_nonce())
        assert read_link(api_broker, token, 60).request_id == req.id
    assert calls == []
    other = Broker(api_broker.redis, api_broker.config, prefix="t:")  # another process, say
    assert read_link(other, first, 60).action == "approve"  # the same shared secret


# ---- the recipient's lists, unmapped addresses and queue roles ------------------------------


def test_a_link_decides_only_through_a_list_of_the_requests_current_queue(
    chained: tuple[TestClient, Broker],
) -> None:
    """A link not bound to a queue (older mail) from `leads` can't decide in `managers`."""
    client, broker = chained
    req = make(broker)
    unbound = link(broker, req, "approve")  # alice is on leads, the list of `default`
    broker.escalate(req.id, decided_by="sweeper")
    resp = client.post(unbound)
    page_error(resp, 403, "forbidden")
    assert "queue managers is decided through email:bosses" in resp.text
    assert broker.get_request(req.id).is_pending
    assert client.post(link(broker, req, "approve", to="boss@example.com")).status_code == 200


def test_an_address_no_approver_has_decides_only_where_its_list_allows(
    redis: Redis, chain: Config
) -> None:
    raw = chain.model_dump(by_alias=True)
    raw["email"]["lists"]["leads"]["to"].append("temp@example.com")
    raw["queues"]["open"] = {"channels": ["email:anyone"]}
    raw["email"]["lists"]["anyone"] = {"to": ["temp@example.com"], "unmapped_may_decide": True}
    cfg = parse_config(raw)
    broker = Broker(redis, cfg, prefix="t:")
    with TestClient(create_app(Settings(), cfg, broker)) as client:
        closed = make(broker)
        resp = client.post(bound(broker, closed, "approve", to="temp@example.com"))
        page_error(resp, 403, "forbidden")
        assert "unmapped_may_decide" in resp.text
        assert broker.get_request(closed.id).is_pending
        opened = make(broker, queue="open")
        assert (
            client.post(bound(broker, opened, "approve", to="temp@example.com")).status_code == 200
        )
        decision = broker.get_request(opened.id).decision
        assert decision is not None and decision.decided_by == "email:temp@example.com"


def test_queue_roles_hold_for_email_links(redis: Redis, chain: Config) -> None:
    raw = chain.model_dump(by_alias=True)
    raw["approvers"]["boss"]["roles"] = ["finance", "managers"]
    raw["queues"]["managers"]["roles"] = ["managers"]
    raw["email"]["lists"]["bosses"]["to"].append("alice@example.com")
    cfg = parse_config(raw)
    broker = Broker(redis, cfg, prefix="t:")
    with TestClient(create_app(Settings(), cfg, broker)) as client:
        req = make(broker, queue="managers")
        resp = client.post(bound(broker, req, "approve"))  # alice: finance, not managers
        page_error(resp, 403, "forbidden")
        assert "the roles of queue managers (managers)" in resp.text
        assert broker.get_request(req.id).is_pending
        assert client.post(bound(broker, req, "approve", to="boss@example.com")).status_code == 200
