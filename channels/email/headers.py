"""Headers for pages opened from an email link: never cached, never framed, no Referer.

The link's path carries a signed, single-use token: a shared cache must not keep the page, the
next site must not learn the URL from `Referer`, and no other site may frame the confirm form
(clickjacking a decision).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

EMAIL_PREFIX = "/v1/email/"
PAGE_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"cache-control", b"no-store"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"content-security-policy", b"frame-ancestors 'none'"),
)
_NAMES = {name for name, _ in PAGE_HEADERS}


class EmailPageHeaders:
    """Set PAGE_HEADERS on every response under /v1/email/ (replacing any the route set)."""

    def __init__(self, app: ASGIApp, prefix: str = EMAIL_PREFIX) -> None:
        self.app = app
        self.prefix = prefix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(self.prefix):
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = [(k, v) for k, v in message.get("headers", []) if k.lower() not in _NAMES]
                message = {**message, "headers": kept + list(PAGE_HEADERS)}
            await send(message)

        await self.app(scope, receive, send_with_headers)
