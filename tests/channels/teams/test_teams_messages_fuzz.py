"""Teams activities under fuzz: hostile activities in anonymous mode (no token needed, so they
reach the activity checks, the Microsoft 365 Agents SDK's adapter and router, the card click
handler and the judge), and hostile Bot Framework tokens with an app id (the SDK's validation
path). Each gets no 5xx, a 4xx `{"error", "detail"}` or Teams' own answer (an invoke
response as JSON, or an empty 202), and changes nothing in Redis.

None of the fuzzed tokens names our app id as its audience, so none is shaped well enough to
make the SDK download signing keys: the suite needs no network.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st
from redis import Redis

from api.app import create_app
from broker.domain.config import Config, parse_config
from broker.domain.models import NewRequest
from broker.domain.settings import Settings
from broker.facade import Broker
from channels.teams import adaptive_cards as cards
from tests.support.fakes.teams import FakeConnector
from tests.support.fuzzing import (
    FUZZ,
    assert_clean_answer,
    assert_unchanged,
    dumps,
    header_text,
    json_values,
    mutated,
    snapshot,
    undecidable_requests,
)
from tests.support.teams_setup import (  # noqa: F401 - the connector fixture
    ADMIN,
    ALICE,
    APP_ID,
    BOB,
    CONVERSATION,
    MALLORY,
    TENANT,
    app_id_config,
    fake_connector,
    invoke,
)

BASES: list[dict[str, Any]] = [
    {
        **invoke("{rid}", "{verb}", "{user}", conversation="{conversation}"),
        "id": "{aid}",
    },
    {
        "type": "message",
        "id": "{aid}",
        "text": "hello",
        "channelId": "msteams",
        "serviceUrl": "http://127.0.0.1:9/",
        "from": {"id": "29:x", "aadObjectId": "{user}"},
        "recipient": {"id": "28:bot"},
        "conversation": {"id": CONVERSATION, "tenantId": TENANT},
    },
    {
        "type": "conversationUpdate",
        "id": "{aid}",
        "channelId": "msteams",
        "serviceUrl": "http://127.0.0.1:9/",
        "membersAdded": [{"id": "28:bot"}],
        "recipient": {"id": "28:bot"},
        "conversation": {"id": CONVERSATION},
    },
]
BASES[0]["value"]["action"]["data"].update(reason="no", answer="x", q0="0", q0_other="y")


def world_config(connector: FakeConnector) -> Config:
    channel = {"service_url": connector.url, "conversation_id": CONVERSATION, "tenant_id": TENANT}
    return parse_config(
        {
            "queues": {
                "default": {"channels": ["teams:approvals"], "escalate_to": "leads"},
                "leads": {"channels": ["teams:approvals"]},
                "held": {"channels": ["inbox"]},
            },
            "teams": {"allow_anonymous": True, "channels": {"approvals": channel}},
            "approvers": {
                "alice": {"roles": ["finance"], "teams_user_id": ALICE},
                "bob": {"roles": ["finance"], "teams_user_id": BOB},
            },
        }
    )


@pytest.fixture
def world(redis: Redis, connector: FakeConnector) -> Iterator[tuple[Broker, TestClient, dict]]:
    config = world_config(connector)
    broker = Broker(redis, config, prefix="fz:")
    requests = undecidable_requests(broker, held="held", decided="default")
    with TestClient(create_app(Settings(admin_token=ADMIN), config, broker)) as client:
        yield broker, client, requests


def post(client: TestClient, body: bytes, **headers: str) -> Any:
    headers = {"Content-Type": "application/json", **headers}
    return client.post("/v1/teams/messages", content=body, headers=headers)


def test_hostile_activities_get_a_clean_answer_and_change_nothing(
    world: tuple[Broker, TestClient, dict],
) -> None:
    broker, client, requests = world
    before = snapshot(broker)
    fills = {
        "rid": [*requests.values(), "req_gone"],
        "verb": [*cards.VERBS, "launch"],
        "user": [ALICE, BOB, MALLORY],
        "conversation": [CONVERSATION, "19:elsewhere@thread.tacv2"],
        "aid": st.integers(min_value=1, max_value=2**62).map(lambda n: f"f:{n}"),
    }

    @FUZZ
    @given(activity=mutated(BASES, fills))
    def run(activity: Any) -> None:
        resp = post(client, dumps(activity))
        assert_clean_answer(resp, empty_ok=(202,))
        assert_unchanged(broker, before, requests)

    run()


def test_bodies_that_are_no_activity_get_a_4xx_and_change_nothing(
    world: tuple[Broker, TestClient, dict],
) -> None:
    broker, client, requests = world
    before = snapshot(broker)

    @FUZZ
    @given(body=st.binary(max_size=200) | json_values.map(dumps))
    def run(body: bytes) -> None:
        resp = post(client, body)
        assert_clean_answer(resp, empty_ok=(202,))
        assert resp.status_code >= 400
        assert_unchanged(broker, before, requests)

    run()


def b64(value: Any) -> str:
    raw = value if isinstance(value, bytes) else json.dumps(value).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


not_our_audience = json_values.filter(lambda v: v != APP_ID)
token_headers = st.one_of(
    json_values,
    st.fixed_dictionaries({"alg": json_values, "kid": json_values}),
    st.fixed_dictionaries({"alg": st.just("RS256"), "kid": st.text(max_size=20)}),
)
token_claims = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {"aud": not_our_audience, "iss": json_values, "exp": json_values, "tid": json_values}
    ),
)
tokens = st.one_of(
    header_text,
    st.tuples(token_headers, token_claims, st.binary(max_size=40)).map(
        lambda t: f"{b64(t[0])}.{b64(t[1])}.{b64(t[2])}"
    ),
)


def test_hostile_tokens_are_refused_with_an_app_id_and_change_nothing(
    redis: Redis, connector: FakeConnector
) -> None:
    config = app_id_config(connector)
    broker = Broker(redis, config, prefix="fz:")
    request = broker.create_request(NewRequest(tool_name="refund", args={"amount": 5}))
    body = json.dumps(invoke(request.id, "approve")).encode()
    with TestClient(create_app(Settings(admin_token=ADMIN), config, broker)) as client:
        before = snapshot(broker)

        @FUZZ
        @given(scheme=st.sampled_from(["Bearer", "bearer", "Basic", ""]), token=tokens)
        def run(scheme: str, token: str) -> None:
            resp = post(client, body, Authorization=f"{scheme} {token}")
            assert_clean_answer(resp)
            assert resp.status_code == 401
            assert snapshot(broker) == before

        run()
    assert broker.get_request(request.id).is_pending
