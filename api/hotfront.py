"""The hot routes answered in front of every ASGI layer the server stacks up (issue 18).

`api.fastpaths` answers a decision or a webhook reply inside the app, after uvicorn's proxy-
headers middleware, FastAPI's and Starlette's own layers, the error middleware, the email-page
headers and the body limit: eight calls deep, a tenth of the API's CPU per e2e cycle in a CPU-
time profile. None of them changes what those two routes answer: the body limit only refuses a
body over its cap (so a hot request without a Content-Length, or over the cap, goes the long
way), the proxy headers rewrite the client address and scheme (the hot routes read neither),
the email headers are for /v1/email/ only. So the server's app is `HotFront`: the same
`api.fastpaths` functions first, every other request (and anything they hand on, marked so
the inner layer doesn't judge it twice) to the stack as before. An error they don't map is
answered and raised as Starlette's error middleware would (500 `internal`, then the server
logs it).
"""

from __future__ import annotations

import logging
from typing import Any

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send

from api import fastpaths
from api.errors import error_response
from api.fastpaths import ANSWERING, DECLINED
from api.limits import MAX_BODY_BYTES

log = logging.getLogger("approval_broker.api")


class HotFront:
    """The hot routes by `api.fastpaths`, straight from the server; the rest to `rest`."""

    def __init__(self, app: Any, rest: ASGIApp, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app  # the FastAPI app: its state, and what fastpaths passes on to
        self.rest = rest
        self.max_bytes = max_bytes
        self.hot = hasattr(getattr(app, "state", None), "hot")  # an app of `api.app`'s making

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            not self.hot
            or scope["type"] != "http"
            or scope["method"] != "POST"
            or not self._small(scope)
        ):
            await self.rest(scope, receive, send)
            return
        try:
            if await fastpaths.serve(self.app, scope, receive, send, self.rest):
                return
        except Exception as exc:
            if DECLINED in scope or ANSWERING in scope:  # answered (or being) by someone else
                raise
            log.error("unhandled %s in the API", type(exc).__name__, exc_info=exc)
            await error_response(500, "internal", "internal error")(scope, receive, send)
            raise
        await self.rest(scope, receive, send)

    def _small(self, scope: Scope) -> bool:
        """A declared body within the cap (`api.limits.BodyLimit` answers the others)."""
        for key, value in scope["headers"]:
            if key == b"content-length":
                return value.isdigit() and int(value) <= self.max_bytes
        return False


class HotConfig(uvicorn.Config):
    """uvicorn's config with `HotFront` outermost, over the app uvicorn loaded and wrapped."""

    def load(self) -> None:
        super().load()
        if not isinstance(self.loaded_app, HotFront):
            self.loaded_app = HotFront(self.app, self.loaded_app)
