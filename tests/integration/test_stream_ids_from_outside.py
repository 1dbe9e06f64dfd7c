"""Stream ids a client hands back (an audit cursor, an SSE `Last-Event-ID`) are read by one
parser, `broker.domain.stream_ids`: what Redis would refuse (a part past 2^64-1, the last id of
all as an exclusive bound, digits of another script, a newline) is a 4xx JSON answer on every
route, and never reaches Redis to come back as a 500 or a broken stream."""

from __future__ import annotations

import base64
import json

import pytest
from fastapi.testclient import TestClient

from broker.domain.models import NewRequest
from broker.domain.stream_ids import MAX_PART, BadStreamId, parse_stream_id, stream_id
from broker.facade import Broker
from tests.support.auth import bearer, person

API_CONFIG = {
    "queues": {"default": {"channels": ["inbox"]}},
    "approvers": {"audrey": person("tok-audrey", ["auditor"])},
}
AUDITOR = bearer("tok-audrey")

REFUSED = [
    f"{MAX_PART}-{MAX_PART}",  # the issue's: valid parts, but nothing comes after it
    f"{MAX_PART + 1}-0",
    f"0-{MAX_PART + 1}",
    "\u0661-\u0660",  # Arabic-Indic digits: `\d` matches them, Redis does not
    "\uff11-\uff10",  # fullwidth digits
    "1-0\n",
    " 1-0",
    "+1-0",
    "1--0",
    "-1-0",
    "",
]


def cursor(start: str) -> str:
    raw = json.dumps([0, start]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@pytest.mark.parametrize("text", REFUSED)
def test_the_parser_refuses_what_redis_would(text: str) -> None:
    with pytest.raises(BadStreamId):
        parse_stream_id(text)


def test_the_parser_reads_ids_redis_reads() -> None:
    assert parse_stream_id("1733-4") == (1733, 4)
    assert parse_stream_id(f"{MAX_PART}-{MAX_PART - 1}") == (MAX_PART, MAX_PART - 1)
    assert parse_stream_id("17", seq=False) == (17, 0)
    assert stream_id("0017-04") == "17-4"
    with pytest.raises(BadStreamId):
        parse_stream_id("17")  # a sequence is needed unless said otherwise


@pytest.mark.parametrize("text", REFUSED)
def test_an_audit_cursor_with_an_id_redis_refuses_is_422(
    text: str, client: TestClient, api_broker: Broker
) -> None:
    api_broker.create_request(NewRequest(tool_name="refund", args={}))
    resp = client.get("/v1/audit", params={"cursor": cursor("(" + text)}, headers=AUDITOR)
    assert resp.status_code == 422, resp.text
    assert resp.json()["error"] == "bad_cursor"


def test_an_audit_cursor_one_before_the_last_id_reads_an_empty_page(
    client: TestClient, api_broker: Broker
) -> None:
    api_broker.create_request(NewRequest(tool_name="refund", args={}))
    near_end = cursor(f"({MAX_PART}-{MAX_PART - 1}")
    resp = client.get("/v1/audit", params={"cursor": near_end}, headers=AUDITOR)
    assert resp.status_code == 200 and resp.json() == [], resp.text


@pytest.mark.parametrize("text", REFUSED)
def test_a_last_event_id_with_an_id_redis_refuses_is_400(
    text: str, client: TestClient, api_broker: Broker
) -> None:
    """Percent-encoded, as an event id is (`urlencode`): the header itself stays ASCII."""
    last = "default=" + "".join(f"%{b:02X}" for b in text.encode())
    headers = {**AUDITOR, "Last-Event-ID": last}
    with client.stream("GET", "/v1/events", headers=headers) as resp:
        status = resp.status_code
        body = resp.read()
    assert status == 400, body
    assert json.loads(body)["error"] == "bad_last_event_id"
