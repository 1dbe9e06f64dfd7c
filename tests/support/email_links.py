"""Email decision links as a test reads them from a mail, and the page a refused link shows."""

from __future__ import annotations

from typing import Any

from broker.domain.models import Request
from broker.facade import Broker
from channels.email.links import new_nonce, sign_link
from tests.support.backends import on_backend, on_backend_api_broker, on_backend_broker  # noqa: F401 - redis, broker, api_broker on both backends


def link(
    broker: Broker,
    req: Request,
    action: str,
    to: str = "alice@example.com",
    nonce: str | None = None,
) -> str:
    return "/v1/email/" + sign_link(broker, req.id, to, action, nonce or new_nonce())


def page_error(resp: Any, status: int, error: str) -> None:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("text/html")
    assert f'data-error="{error}"' in resp.text, resp.text
