"""Teams: a malformed Bot Framework token or a malformed activity gets a 4xx with an
`{"error", "detail"}` body before the Microsoft 365 Agents SDK sees it, and decides nothing.

The tokens are refused in both modes: with an app id (the SDK's real validation path, which
would otherwise look a missing `kid` up and fail with a KeyError) and in anonymous mode, where
a token that is sent is still checked. None of the tokens here may reach the SDK's key
download: each is refused by its shape first.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from fastapi.testclient import TestClient
from httpx import Response
from redis import Redis

from api.app import create_app
from broker.domain.config import Config
from broker.domain.models import NewRequest, Request
from broker.domain.settings import Settings
from broker.facade import Broker
from tests.support.fakes.teams import FakeConnector
from tests.support.teams_setup import (  # noqa: F401 - the connector fixture
    ADMIN,
    APP_ID,
    app_id_config,
    fake_connector,
    invoke,
    teams_config,
)

RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
CLAIMS = {
    "aud": APP_ID,
    "iss": "https://api.botframework.com",
    "serviceurl": "http://127.0.0.1:9/",
    "exp": 4_000_000_000,
}


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def segments(header: Any, payload: Any = CLAIMS, signature: bytes = b"sig") -> str:
    """A token of three segments whose header and payload are whatever JSON is given."""
    return ".".join(
        [b64(json.dumps(header).encode()), b64(json.dumps(payload).encode()), b64(signature)]
    )


TOKENS = {
    "alg-none-no-kid": jwt.encode(CLAIMS, None, algorithm="none"),
    "hs256-no-kid": jwt.encode(CLAIMS, "a-shared-secret-of-32-bytes-long", algorithm="HS256"),
    "rs256-no-kid": jwt.encode(CLAIMS, RSA_KEY, algorithm="RS256"),
    "hs256-with-a-kid": jwt.encode(
        CLAIMS, "a-shared-secret-of-32-bytes-long", algorithm="HS256", headers={"kid": "k1"}
    ),
    "rs256-kid-for-another-app": jwt.encode(
        {**CLAIMS, "aud": "someone-else"}, RSA_KEY, algorithm="RS256", headers={"kid": "k1"}
    ),
    "kid-not-a-string": segments({"alg": "RS256", "kid": 5}),
    "kid-an-object": segments({"alg": "RS256", "kid": {"a": 1}}),
    "header-an-array": segments([1, 2]),
    "payload-an-array": segments({"alg": "RS256", "kid": "k1"}, [1]),
    "header-not-json": b64(b"{nope") + "." + b64(b"{}") + "." + b64(b"s"),
    "not-base64": "%%%.%%%.%%%",
    "one-segment": "abc",
    "two-segments": "a.b",
    "empty-segments": "..",
    "huge": "a" * 20_000 + ".b.c",
}


@pytest.fixture
def app_id_mode(redis: Redis, connector: FakeConnector) -> Iterator[tuple[Broker, TestClient]]:
    yield from serve(redis, app_id_config(connector))


@pytest.fixture
def anonymous(redis: Redis, connector: FakeConnector) -> Iterator[tuple[Broker, TestClient]]:
    yield from serve(redis, teams_config(connector))


def serve(redis: Redis, config: Config) -> Iterator[tuple[Broker, TestClient]]:
    broker = Broker(redis, config, prefix="tm:")
    app = create_app(Settings(admin_token=ADMIN), config, broker)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield broker, client


def pending(broker: Broker) -> Request:
    return broker.create_request(NewRequest(tool_name="refund", args={"amount": 5}))


def untouched(broker: Broker, request: Request) -> None:
    after = broker.get_request(request.id)
    assert after.is_pending and after.approvals == [] and after.history == request.history


def refused_with_a_body(resp: Response, status: int) -> dict[str, Any]:
    assert resp.status_code == status, (resp.status_code, resp.text)
    body = resp.json()
    assert set(body) == {"error", "detail"} and body["detail"]
    return body


def post(client: TestClient, body: bytes | dict[str, Any], **headers: str) -> Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **headers}
    return client.post("/v1/teams/messages", content=content, headers=headers)


# ---- tokens ----------------------------------------------------------------------------


@pytest.mark.parametrize("token", list(TOKENS.values()), ids=list(TOKENS))
def test_a_malformed_token_is_a_401_with_an_error_body_when_the_bot_has_an_app_id(
    app_id_mode: tuple[Broker, TestClient], token: str
) -> None:
    broker, client = app_id_mode
    request = pending(broker)
    resp = post(client, invoke(request.id, "approve"), Authorization=f"Bearer {token}")
    assert refused_with_a_body(resp, 401)["error"] == "unauthorized"
    untouched(broker, request)


@pytest.mark.parametrize("name", ["alg-none-no-kid", "hs256-no-kid", "rs256-no-kid", "huge"])
def test_a_malformed_token_is_a_401_in_anonymous_mode_too(
    anonymous: tuple[Broker, TestClient], name: str
) -> None:
    broker, client = anonymous
    request = pending(broker)
    resp = post(client, invoke(request.id, "approve"), Authorization=f"Bearer {TOKENS[name]}")
    assert refused_with_a_body(resp, 401)["error"] == "unauthorized"
    untouched(broker, request)


# ---- activities (anonymous mode: no token needed to reach them) ---------------------------


def without_service_url(activity: dict[str, Any]) -> dict[str, Any]:
    del activity["serviceUrl"]
    return activity


def with_value(value: Any) -> Any:
    def change(activity: dict[str, Any]) -> dict[str, Any]:
        activity["value"] = value
        return activity

    return change


def with_action(**fields: Any) -> Any:
    def change(activity: dict[str, Any]) -> dict[str, Any]:
        activity["value"]["action"].update(fields)
        return activity

    return change


def named(name: str) -> Any:
    def change(activity: dict[str, Any]) -> dict[str, Any]:
        activity["name"] = name
        return activity

    return change


MALFORMED = {
    "no-service-url": without_service_url,
    "service-url-not-a-url": lambda a: {**a, "serviceUrl": "not a url"},
    "service-url-a-number": lambda a: {**a, "serviceUrl": 5},
    "unknown-verb": with_action(verb="launch-missiles"),
    "verb-not-a-string": with_action(verb=["approve"]),
    "not-action-execute": with_action(type="Action.Submit"),
    "data-not-an-object": with_action(data=[1, 2]),
    "input-not-text": with_action(data={"request_id": "x", "reason": {"a": 1}}),
    "value-a-string": with_value("approve"),
    "value-a-list": with_value([1, 2, 3]),
    "value-a-number": with_value(5),
    "value-without-action": with_value({"trigger": "manual"}),
    "another-invoke": named("composeExtension/query"),
    "no-from": lambda a: {k: v for k, v in a.items() if k != "from"},
    "from-without-an-id": lambda a: {**a, "from": {"aadObjectId": a["from"]["aadObjectId"]}},
    "no-recipient": lambda a: {k: v for k, v in a.items() if k != "recipient"},
    "no-channel-id": lambda a: {k: v for k, v in a.items() if k != "channelId"},
    "empty-channel-id": lambda a: {**a, "channelId": ""},
    "action-without-data": with_action(data=None),
    "conversation-not-an-object": lambda a: {**a, "conversation": "19:x"},
    "from-a-number": lambda a: {**a, "from": 5},
}


@pytest.mark.parametrize("change", list(MALFORMED.values()), ids=list(MALFORMED))
def test_a_malformed_activity_is_a_400_with_an_error_body(
    anonymous: tuple[Broker, TestClient], change: Any
) -> None:
    broker, client = anonymous
    request = pending(broker)
    resp = post(client, change(invoke(request.id, "approve")))
    assert refused_with_a_body(resp, 400)["error"] == "bad_request"
    untouched(broker, request)


def test_a_reason_over_10000_characters_is_refused_with_an_error_body(
    anonymous: tuple[Broker, TestClient],
) -> None:
    """The card's reason input holds 2,000 characters: only a forged body sends more."""
    broker, client = anonymous
    request = pending(broker)
    resp = post(client, invoke(request.id, "reject", reason="x" * 10_001))
    refused_with_a_body(resp, 400)
    untouched(broker, request)


def test_a_body_nested_3000_deep_is_a_400_with_an_error_body(
    anonymous: tuple[Broker, TestClient],
) -> None:
    broker, client = anonymous
    request = pending(broker)
    head = json.dumps(invoke(request.id, "approve"))[:-1]  # without its closing brace
    body = (head + ', "deep": ' + "[" * 3000 + "]" * 3000 + "}").encode()
    assert refused_with_a_body(post(client, body), 400)["error"] == "bad_request"
    untouched(broker, request)
