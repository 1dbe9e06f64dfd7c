"""A listing cursor is a client's text: any cursor that doesn't parse or validate is a 422.

`bad_cursor` for bad base64, JSON that isn't a list of three strings, a score that isn't a
finite number as Redis writes one (`nan`, `inf`), an id no request has the shape of, an index
of other filters, or a cursor far longer than any the listing gives; never a 500.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from redis import Redis

from api.app import create_app
from broker.domain.config import Config
from broker.domain.settings import Settings
from broker.facade import Broker
from tests.support.auth import person

AGENT = {"Authorization": "Bearer tok-agent"}


API_CONFIG = {
    "queues": {"default": {"channels": ["inbox"]}},
    "approvers": {"agent": person("tok-agent", ["requester"])},
}


@pytest.fixture
def client(redis: Redis, cfg: Config) -> Iterator[TestClient]:
    broker = Broker(redis, cfg, prefix="t:")
    with TestClient(create_app(Settings(), cfg, broker), raise_server_exceptions=False) as c:
        for n in range(3):
            assert (
                c.post("/v1/requests", json={"tool_name": f"t{n}"}, headers=AGENT).status_code
                == 201
            )
        yield c


def b64(value: Any) -> str:
    raw = value if isinstance(value, bytes) else json.dumps(value).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def test_the_cursor_the_listing_gives_still_pages(client: TestClient) -> None:
    first = client.get("/v1/requests?limit=2", headers=AGENT)
    assert first.status_code == 200 and len(first.json()) == 2
    cursor = first.headers["x-next-cursor"]
    assert json.loads(base64.urlsafe_b64decode(cursor + "==="))[0] == "ix:creator:agent"
    rest = client.get(f"/v1/requests?limit=2&cursor={cursor}", headers=AGENT)
    assert rest.status_code == 200 and len(rest.json()) == 1


@pytest.mark.parametrize(
    "cursor",
    [
        b64(["ix:creator:agent", "nan", "a"]),
        b64(["ix:creator:agent", "inf", "a"]),
        b64(["ix:creator:agent", "-Infinity", "a"]),
        b64(["ix:creator:agent", "1e999", "a"]),
        b64(["ix:creator:agent", "0x10", "a"]),
        b64(["ix:creator:agent", " 1", "a"]),
        b64(["ix:creator:agent", 1.5, "a"]),
        b64(["ix:creator:agent", "1.5", 7]),
        b64(["ix:creator:agent", "1.5", "a b\r\n"]),
        b64(["ix:creator:agent", "1.5", ""]),
        b64(["ix:creator:agent", "1.5"]),
        b64(["ix:creator:agent", "1.5", "a", "b"]),
        b64({"index": "ix:creator:agent"}),
        b64(["ix:creator:other", "1.5", "a"]),
        b64(["ix:requests", "1.5", "a"]),
        b64([[[[["deep"]]]], "1.5", "a"]),
        b64(b'["ix:creator:agent", NaN, "a"]'),
        b64(b"\xff\xfe not json"),
        "%%%",
        "YQ",
        "a" * 999,
    ],
)
def test_a_forged_cursor_is_a_422_bad_cursor(client: TestClient, cursor: str) -> None:
    response = client.get("/v1/requests", params={"cursor": cursor}, headers=AGENT)
    assert response.status_code == 422, response.text
    assert response.json()["error"] == "bad_cursor" and response.json()["detail"].startswith(
        "cursor:"
    )
