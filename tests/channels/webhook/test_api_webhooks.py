"""Signed webhook replies: Standard Webhooks signatures (forged, stale, replayed, rotated), roles."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.facade import Broker
from tests.support.backends import on_backend, on_backend_api_broker, on_backend_broker, single_only  # noqa: F401 - redis, broker, api_broker on both backends
from tests.support.webhooks import (  # noqa: F401 - webhook_cfg: the module's `cfg` fixture
    OLD_SECRET,
    OTHER_SECRET,
    make,
    post,
    signed,
    webhook_cfg,
)


def test_signed_reply_decides_as_the_endpoint_and_person(
    client: TestClient, api_broker: Broker
) -> None:
    a, b = make(api_broker), make(api_broker)
    resp = post(client, "ops", *signed({"request_id": a.id, "outcome": "approved"}))
    assert resp.status_code == 200, resp.text
    assert resp.json()["decision"]["decided_by"] == "webhook:ops"
    body = {"request_id": b.id, "outcome": "rejected", "reason": "no", "decided_by": "dana"}
    resp = post(client, "ops", *signed(body, OLD_SECRET, msg_id="msg_2"))  # rotated-out secret
    assert resp.status_code == 200, resp.text
    stored = api_broker.get_request(b.id)
    assert stored.status.value == "rejected" and stored.decision is not None
    assert stored.decision.decided_by == "webhook:ops/dana" and stored.decision.reason == "no"


@pytest.mark.parametrize(
    "mangle",
    [
        pytest.param(lambda raw, h: signed(json.loads(raw), OTHER_SECRET), id="forged"),
        pytest.param(lambda raw, h: signed(json.loads(raw), age_s=360), id="stale-6-minutes"),
        pytest.param(lambda raw, h: signed(json.loads(raw), age_s=-360), id="from-the-future"),
        pytest.param(lambda raw, h: (raw.replace(b"approved", b"rejected"), h), id="tampered"),
        pytest.param(
            lambda raw, h: (raw, {**h, "webhook-signature": "garbage"}), id="malformed-sig"
        ),
        pytest.param(
            lambda raw, h: (raw, {**h, "webhook-signature": "v1,not base64!"}), id="bad-base64"
        ),
        pytest.param(lambda raw, h: (raw, {**h, "webhook-timestamp": "soon"}), id="bad-ts"),
        pytest.param(lambda raw, h: (raw, {"content-type": "application/json"}), id="no-headers"),
    ],
)
def test_bad_signatures_are_401_and_decide_nothing(
    client: TestClient, api_broker: Broker, mangle: Any
) -> None:
    req = make(api_broker)
    raw, headers = mangle(*signed({"request_id": req.id, "outcome": "approved"}))
    resp = post(client, "ops", raw, headers)
    assert resp.status_code == 401, resp.text
    assert resp.json()["error"] == "bad_signature"
    assert api_broker.get_request(req.id).is_pending


def test_replayed_webhook_id_is_refused(client: TestClient, api_broker: Broker) -> None:
    keys = api_broker.keys
    a = make(api_broker)
    # b shares a's partition (on a single Redis every request does): on a cluster the id's
    # marker is kept there, spent in the same step as the decision (a re-signed id for a
    # request in another partition is a known gap, docs/architecture.md "Known gaps")
    b = make(api_broker)
    while keys.partition_of_request(b.id) != keys.partition_of_request(a.id):
        b = make(api_broker)
    raw, headers = signed({"request_id": a.id, "outcome": "approved"}, msg_id="msg_r")
    assert post(client, "ops", raw, headers).status_code == 200
    replay = post(client, "ops", raw, headers)
    assert replay.status_code == 409 and replay.json()["error"] == "replayed"
    assert replay.json()["request"]["decision"]["decided_by"] == "webhook:ops"  # names the winner
    # the same id re-signed over another body is still the same message: refused
    raw2, headers2 = signed({"request_id": b.id, "outcome": "approved"}, msg_id="msg_r")
    assert post(client, "ops", raw2, headers2).json()["error"] == "replayed"
    assert api_broker.get_request(b.id).is_pending
    marker = keys.in_partition(keys.seen("webhook", "ops:msg_r"), keys.partition_of_request(a.id))
    assert api_broker.redis.ttl(marker) > 600


def test_bad_body_is_422_and_does_not_burn_the_id(client: TestClient, api_broker: Broker) -> None:
    req = make(api_broker)
    for body in (b"not json", {"outcome": "approved"}, {"request_id": req.id, "outcome": "x"}):
        resp = post(client, "ops", *signed(body, msg_id="msg_b"))
        assert resp.status_code == 422 and resp.json()["error"] == "invalid", resp.text
    bad_person = {"request_id": req.id, "outcome": "approved", "decided_by": "a/b"}
    assert post(client, "ops", *signed(bad_person, msg_id="msg_b")).status_code == 422
    fixed = post(
        client, "ops", *signed({"request_id": req.id, "outcome": "approved"}, msg_id="msg_b")
    )
    assert fixed.status_code == 200


def test_endpoint_roles_and_unknown_things(client: TestClient, api_broker: Broker) -> None:
    finance = make(api_broker, allowed_roles=["finance"])
    ops = make(api_broker, allowed_roles=["ops"])
    resp = post(
        client, "ops", *signed({"request_id": finance.id, "outcome": "approved"}, msg_id="1")
    )
    assert resp.status_code == 403 and resp.json()["error"] == "forbidden"
    resp = post(
        client,
        "bare",
        *signed({"request_id": ops.id, "outcome": "approved"}, OTHER_SECRET, msg_id="2"),
    )
    assert resp.status_code == 403
    assert (
        api_broker.get_request(finance.id).is_pending and api_broker.get_request(ops.id).is_pending
    )
    resp = post(client, "ops", *signed({"request_id": ops.id, "outcome": "approved"}, msg_id="3"))
    assert resp.status_code == 200
    resp = post(
        client, "nowhere", *signed({"request_id": ops.id, "outcome": "approved"}, msg_id="4")
    )
    assert resp.status_code == 404 and resp.json()["error"] == "not_found"
    resp = post(
        client, "ops", *signed({"request_id": "req_nope", "outcome": "approved"}, msg_id="5")
    )
    assert resp.status_code == 404


def test_late_reply_is_409_with_the_winner(client: TestClient, api_broker: Broker) -> None:
    req = make(api_broker)
    first = post(
        client,
        "ops",
        *signed({"request_id": req.id, "outcome": "approved", "decided_by": "dana"}, msg_id="a"),
    )
    assert first.status_code == 200
    late = post(client, "ops", *signed({"request_id": req.id, "outcome": "rejected"}, msg_id="b"))
    assert late.status_code == 409 and late.json()["error"] == "conflict"
    assert late.json()["request"]["decision"]["decided_by"] == "webhook:ops/dana"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


def test_signed_but_strange_bodies_never_get_a_5xx(client: TestClient, api_broker: Broker) -> None:
    """Anything an endpoint could sign gets a 4xx/200 JSON answer, never a 500."""
    req = make(api_broker)
    ids = iter(range(1_000_000))

    @settings(
        max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(
        body=st.fixed_dictionaries(
            {
                "request_id": st.sampled_from([req.id, "req_nope"]) | json_values,
                "outcome": st.sampled_from(["approved", "modified", "escalated", "timed_out"])
                | json_values,
            },
            optional={
                "args": json_values,
                "answer": json_values,
                "target": json_values,
                "decided_by": json_values,
                "reason": json_values,
            },
        )
        | json_values
    )
    def run(body: Any) -> None:
        resp = post(client, "ops", *signed(body, msg_id=f"fuzz-{next(ids)}"))
        assert resp.status_code < 500, resp.text
        assert set(resp.json()) >= ({"error", "detail"} if resp.status_code >= 400 else {"id"})

    run()


def test_a_deeply_nested_signed_body_is_422(client: TestClient, api_broker: Broker) -> None:
    req = make(api_broker)
    nested = b"[" * 100_000 + b"]" * 100_000
    raw = b'{"request_id": "%s", "outcome": "approved", "metadata": {"a": %s}}' % (
        req.id.encode(),
        nested,
    )
    resp = post(client, "ops", *signed(raw, msg_id="msg_deep"))
    assert resp.status_code == 422 and resp.json()["error"] == "invalid"
    assert api_broker.get_request(req.id).is_pending


# ---- the endpoint's queues and queue roles ------------------------------------------------


def test_an_endpoint_decides_only_requests_of_its_queues(
    client: TestClient, api_broker: Broker
) -> None:
    req = make(api_broker, queue="elsewhere")  # decided through webhook:bare only
    raw, headers = signed({"request_id": req.id, "outcome": "approved"}, msg_id="msg_q")
    resp = post(client, "ops", raw, headers)
    assert resp.status_code == 403 and resp.json()["error"] == "forbidden"
    assert "queue elsewhere is decided through webhook:bare" in resp.json()["detail"]
    assert api_broker.get_request(req.id).is_pending
    assert not api_broker.redis.exists(api_broker.keys.seen("webhook", "ops:msg_q"))  # unspent
    resp = post(
        client,
        "bare",
        *signed({"request_id": req.id, "outcome": "approved"}, OTHER_SECRET, msg_id="msg_q"),
    )
    assert resp.status_code == 200 and resp.json()["decision"]["decided_by"] == "webhook:bare"


def test_an_endpoint_without_roles_is_held_back_by_queue_roles(
    client: TestClient, api_broker: Broker
) -> None:
    req = make(api_broker, queue="guarded")  # no allowed_roles; the queue wants ops
    resp = post(
        client,
        "bare",
        *signed({"request_id": req.id, "outcome": "approved"}, OTHER_SECRET, msg_id="g1"),
    )
    assert resp.status_code == 403 and "the roles of queue guarded (ops)" in resp.json()["detail"]
    assert api_broker.get_request(req.id).is_pending
    resp = post(client, "ops", *signed({"request_id": req.id, "outcome": "approved"}, msg_id="g2"))
    assert resp.status_code == 200


def test_a_person_named_by_the_endpoint_is_recorded_without_bidi_overrides(
    client: TestClient, api_broker: Broker
) -> None:
    req = make(api_broker)
    body = {"request_id": req.id, "outcome": "approved", "decided_by": "da\u202ena"}
    resp = post(client, "ops", *signed(body, msg_id="bidi"))
    assert resp.status_code == 200 and resp.json()["decision"]["decided_by"] == "webhook:ops/dana"
