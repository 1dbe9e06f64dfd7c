"""One person, one vote, whatever channel carries it; a notify-only endpoint decides nothing.

`webhook:NAME/PERSON` counts as the approver PERSON names (by name, email address or chat user
id), names compared after Unicode normalisation (NFKC, format characters removed, case-folded),
email addresses compared case-insensitively; a PERSON who is no approver is the endpoint itself,
so one endpoint is at most one vote of its own. Neither a second channel nor a second spelling
is a second vote, and the one who asked never approves under another spelling. A `[webhooks.NAME] decides = false`
endpoint's signed replies are 403. The config refuses two approvers sharing an identity.
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from broker.domain.config import parse_config
from broker.domain.errors import ConfigError
from broker.domain.models import NewRequest, Request
from broker.facade import Broker
from tests.support.auth import person
from tests.support.email_links import link
from tests.support.webhooks import NEW_SECRET, OTHER_SECRET, post, signed  # noqa: F401

ALICE = "tok-alice-one-person"
CAROL = "tok-carol-one-person"


API_CONFIG = {
    "queues": {
        "default": {"channels": ["inbox", "webhook:ops", "webhook:audit"]},
        "pair": {"channels": ["inbox", "webhook:ops", "email:ext"], "quorum": 2},
    },
    "webhooks": {
        "ops": {"url": "http://127.0.0.1:9/ops", "secret": NEW_SECRET},
        "audit": {
            "url": "http://127.0.0.1:9/audit",
            "secret": OTHER_SECRET,
            "events": ["approval.decided", "approval.timed_out"],
            "decides": False,
        },
    },
    "email": {
        "public_url": "http://testserver",
        "link_ttl_s": 3600,
        "lists": {
            "ext": {
                "to": ["ext@example.com", "EXT@example.com"],
                "unmapped_may_decide": True,
            }
        },
    },
    "approvers": {
        "alice": {
            **person(ALICE, ["finance"]),
            "email": "alice@example.test",
            "slack_user_id": "U_ALICE",
            "teams_user_id": "7f3c0c1e-5b5e-4c8e-9d51-1f0a3e2b4c6d",
            "telegram_user_id": 4242,
            "discord_user_id": "80351110224678912",
        },
        "carol": {**person(CAROL, ["finance"]), "email": "carol@example.test"},
    },
}


def make(broker: Broker, **kw: Any) -> Request:
    return broker.create_request(NewRequest(tool_name="refund", args={"amount": 9}, **kw))


def reply(client: TestClient, req: Request, msg_id: str, **fields: Any) -> Any:
    body = {"request_id": req.id, "outcome": "approved", **fields}
    return post(client, "ops", *signed(body, msg_id=msg_id))


@pytest.mark.parametrize("spelling", ["alice", "Alice", "alice\u200b", "ＡＬＩＣＥ"])
def test_a_rest_vote_and_a_webhook_reply_naming_the_same_person_are_one_vote(
    spelling: str, client: TestClient, api_broker: Broker
) -> None:
    req = make(api_broker, queue="pair")
    rest = client.post(
        f"/v1/requests/{req.id}/decision",
        json={"outcome": "approved"},
        headers={"Authorization": f"Bearer {ALICE}"},
    )
    assert rest.status_code == 200 and rest.json()["status"] == "pending"
    again = reply(client, req, "msg_alice", decided_by=spelling)
    assert again.status_code == 200, again.text
    stored = api_broker.get_request(req.id)
    assert stored.is_pending  # quorum 2 is not met by one person
    assert [v.by for v in stored.approvals] == ["alice"]
    # a second person does meet it
    other = reply(client, req, "msg_carol", decided_by="carol")
    assert other.status_code == 200 and other.json()["status"] == "approved"
    assert sorted(v.by for v in api_broker.get_request(req.id).approvals) == ["alice", "carol"]


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("webhook:ops", None),  # the issue's: `webhook:ops/webhook:ops`, then `webhook:ops`
        (None, "webhook:ops"),
        ("dana", "erin"),  # two made-up people
        ("dana", None),
        ("webhook:audit", "admin"),  # another endpoint's name, the admin's
    ],
)
def test_one_endpoint_is_one_vote_whatever_unconfigured_people_it_names(
    first: str | None, second: str | None, client: TestClient, api_broker: Broker
) -> None:
    req = make(api_broker, queue="pair")
    one = reply(client, req, "msg_first", **({"decided_by": first} if first else {}))
    assert one.status_code == 200 and one.json()["status"] == "pending", one.text
    two = reply(client, req, "msg_second", **({"decided_by": second} if second else {}))
    assert two.status_code == 200, two.text  # the endpoint's one vote, repeated
    stored = api_broker.get_request(req.id)
    assert stored.is_pending  # quorum 2 is not met by one endpoint
    assert [v.by for v in stored.approvals] == ["webhook:ops"]
    # a configured person it vouches for is a second vote
    other = reply(client, req, "msg_carol", decided_by="carol")
    assert other.status_code == 200 and other.json()["status"] == "approved"


@pytest.mark.parametrize(
    "spelling",
    [
        "alice@example.test",
        "ALICE@Example.TEST",
        "email:alice@example.test",
        "U_ALICE",
        "slack:U_ALICE",
        "7F3C0C1E-5B5E-4C8E-9D51-1F0A3E2B4C6D",
        "teams:7f3c0c1e-5b5e-4c8e-9d51-1f0a3e2b4c6d",
        "4242",
        "telegram:4242",
        "80351110224678912",
        "discord:80351110224678912",
    ],
)
def test_a_webhook_reply_naming_an_approvers_address_or_user_id_is_that_approver(
    spelling: str, client: TestClient, api_broker: Broker
) -> None:
    req = make(api_broker, queue="pair")
    rest = client.post(
        f"/v1/requests/{req.id}/decision",
        json={"outcome": "approved"},
        headers={"Authorization": f"Bearer {ALICE}"},
    )
    assert rest.status_code == 200 and rest.json()["status"] == "pending"
    again = reply(client, req, "msg_alice", decided_by=spelling)
    assert again.status_code == 200, again.text
    stored = api_broker.get_request(req.id)
    assert stored.is_pending  # alice twice is one person
    assert [v.by for v in stored.approvals] == ["alice"]


@pytest.mark.parametrize(
    "spelling", ["carol@example.test", "CAROL@example.test", "email:carol@example.test"]
)
def test_the_creator_may_not_approve_through_a_webhook_naming_their_address(
    spelling: str, client: TestClient, api_broker: Broker
) -> None:
    req = make(api_broker, created_by="carol")
    resp = reply(client, req, "msg_creator", decided_by=spelling)
    assert resp.status_code == 403, resp.text
    assert resp.json()["error"] == "creator_may_not_approve"
    assert api_broker.get_request(req.id).is_pending


@pytest.mark.parametrize("spelling", ["dana", "webhook:ops", None])
def test_an_endpoint_may_not_approve_what_it_asked_for_under_a_made_up_name(
    spelling: str | None, client: TestClient, api_broker: Broker
) -> None:
    """`created_by` = the endpoint (an app in process may record that): every person it names
    who is no approver is the endpoint again, so the creator rule holds."""
    req = make(api_broker, created_by="webhook:ops")
    resp = reply(client, req, "msg_endpoint", **({"decided_by": spelling} if spelling else {}))
    assert resp.status_code == 403, resp.text
    assert resp.json()["error"] == "creator_may_not_approve"
    assert api_broker.get_request(req.id).is_pending


def test_two_addresses_differing_in_case_are_one_person(
    client: TestClient, api_broker: Broker
) -> None:
    req = make(api_broker, queue="pair")
    lower = link(api_broker, req, "approve", "ext@example.com")
    upper = link(api_broker, req, "approve", "EXT@example.com")
    assert client.post(lower).status_code == 200
    assert client.post(upper).status_code == 200  # a harmless repeat of the same vote
    stored = api_broker.get_request(req.id)
    assert stored.is_pending
    assert [v.by for v in stored.approvals] == ["email:ext@example.com"]


@pytest.mark.parametrize("spelling", ["carol\u200b", "Carol", "CAROL", "ｃａｒｏｌ", "c\u00adarol"])
def test_the_creator_may_not_approve_through_a_webhook_under_another_spelling(
    spelling: str, client: TestClient, api_broker: Broker
) -> None:
    req = make(api_broker, created_by="carol")
    resp = reply(client, req, "msg_creator", decided_by=spelling)
    assert resp.status_code == 403, resp.text
    assert resp.json()["error"] == "creator_may_not_approve"
    assert api_broker.get_request(req.id).is_pending


def test_a_notify_only_endpoint_is_refused_and_a_deciding_one_still_decides(
    client: TestClient, api_broker: Broker
) -> None:
    req = make(api_broker)
    body = {"request_id": req.id, "outcome": "approved"}
    refused = post(client, "audit", *signed(body, OTHER_SECRET, msg_id="msg_audit"))
    assert refused.status_code == 403, refused.text
    assert "notify-only" in refused.json()["detail"]
    with_rule = {**body, "remember": {"tool": "refund", "run_id": "run_x"}}
    refused = post(client, "audit", *signed(with_rule, OTHER_SECRET, msg_id="msg_audit_2"))
    assert refused.status_code == 403, refused.text
    unsigned = post(client, "audit", *signed(body, NEW_SECRET, msg_id="msg_audit_3"))
    assert unsigned.status_code == 401  # the signature is checked first, as for any endpoint
    assert api_broker.get_request(req.id).is_pending
    decided = reply(client, req, "msg_ops")  # `decides` left out: true
    assert decided.status_code == 200 and decided.json()["status"] == "approved"


@pytest.mark.parametrize(
    ("second", "key"),
    [
        ({"slack_user_id": "U1"}, "approvers.bob.slack_user_id"),
        ({"email": "ALICE@example.com"}, "approvers.bob.email"),
    ],
)
def test_the_config_refuses_two_approvers_sharing_an_identity(
    second: dict[str, str], key: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(
            {
                "approvers": {
                    "alice": {"roles": ["finance"], "slack_user_id": "U1", "email": "alice@example.com"},
                    "bob": {"roles": ["finance"], **second},
                }
            }
        )  # fmt: skip
    text = str(caught.value)
    assert "\n" not in text and key in text and "'alice'" in text


def test_the_config_refuses_two_approver_names_that_normalise_alike() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"approvers": {"alice": {"roles": ["a"]}, "Alice": {"roles": ["a"]}}})
    assert "approvers.Alice" in str(caught.value)
