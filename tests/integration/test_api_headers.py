"""Email pages are never cached, framed or leaked by Referer; /docs loads nothing from a CDN;
/openapi.json documents the API's own error body."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from redis import Redis

from api.app import create_app
from broker.domain.config import Config
from broker.domain.models import NewRequest
from broker.domain.settings import Settings
from broker.facade import Broker
from channels.email.links import new_nonce, sign_link

PAGE_HEADERS = {
    "cache-control": "no-store",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
    "content-security-policy": "frame-ancestors 'none'",
}


API_CONFIG = {
    "queues": {"default": {"channels": ["email:leads"]}},
    "email": {
        "public_url": "http://testserver",
        "lists": {"leads": {"to": ["alice@example.com"]}},
    },
    "approvers": {"alice": {"roles": ["finance"], "email": "alice@example.com"}},
}


@pytest.fixture
def app_client(redis: Redis, cfg: Config) -> Iterator[tuple[TestClient, Broker]]:
    broker = Broker(redis, cfg, prefix="t:")
    with TestClient(create_app(Settings(admin_token="tok-admin"), cfg, broker)) as client:
        yield client, broker


def assert_page_headers(resp: object) -> None:
    headers = resp.headers  # type: ignore[attr-defined]
    for name, value in PAGE_HEADERS.items():
        assert headers.get_list(name) == [value], (name, headers.get_list(name))


def test_email_pages_are_not_cached_framed_or_referred(
    app_client: tuple[TestClient, Broker],
) -> None:
    client, broker = app_client
    req = broker.create_request(NewRequest(tool_name="refund", args={"a": 1}))
    url = "/v1/email/" + sign_link(broker, req.id, "alice@example.com", "approve", new_nonce())
    shown = client.get(url)
    assert shown.status_code == 200 and "text/html" in shown.headers["content-type"]
    assert_page_headers(shown)
    done = client.post(url, data={})
    assert done.status_code == 200 and broker.get_request(req.id).status.value == "approved"
    assert_page_headers(done)
    for resp in (client.post(url, data={}), client.get("/v1/email/forged")):  # error pages too
        assert resp.status_code >= 400
        assert_page_headers(resp)
    other = client.get("/healthz")  # the rest of the API is not changed
    assert "x-frame-options" not in other.headers and "referrer-policy" not in other.headers


def test_docs_load_only_local_assets(app_client: tuple[TestClient, Broker]) -> None:
    client, _ = app_client
    page = client.get("/docs")
    assert page.status_code == 200
    refs = re.findall(r"""(?:src|href)=["']([^"']+)""", page.text)
    assert refs and all(ref.startswith("/") for ref in refs), refs
    assert "http://" not in page.text and "https://" not in page.text
    for ref in refs:
        asset = client.get(ref)
        assert asset.status_code == 200 and len(asset.content) > 100, ref
    assert client.get("/redoc").status_code == 404  # its page needs a CDN: not served


def test_openapi_documents_the_error_body_not_fastapis(
    app_client: tuple[TestClient, Broker],
) -> None:
    client, _ = app_client
    doc = client.get("/openapi.json").json()
    assert "HTTPValidationError" not in str(doc)
    ops = {(m, p): op for p, item in doc["paths"].items() for m, op in item.items()}
    for key in [("get", "/v1/me"), ("get", "/v1/queues")]:
        assert "401" in ops[key]["responses"], key
    for key in [("post", "/v1/requests"), ("post", "/v1/runs")]:
        for status in ("400", "413", "422"):
            body = ops[key]["responses"][status]["content"]["application/json"]["schema"]
            assert body == {"$ref": "#/components/schemas/ErrorBody"}, (key, status)
    events_429 = ops[("get", "/v1/events")]["responses"]["429"]["content"]
    assert list(events_429) == ["application/json"]
    assert "404" in ops[("get", "/v1/email/{token}")]["responses"]
