"""An MCP message body, checked within bounds before the `mcp` SDK parses it.

The SDK's Streamable HTTP transport reads a POST body with `json.loads` and validates it with
pydantic: a body nested 2,000 deep is a `RecursionError` there, an integer of 5,000 digits a
`ValueError`, and either is a 500 (`Error handling POST request`). A number past a double
(`1e999`) the SDK turns into `null` without a word (it re-serialises the message), so
`"args": {"amount": 1e999}` became a request for `{"amount": null}`. So `/mcp` (and the MCP
gateway's `/mcp`) read the body first with `broker.domain.bounded_json` (the size and depth
bounds every body from outside gets) and check it as REST checks its bodies
(`api.schemas.check_json_safe`: finite numbers, valid Unicode), answer what they refuse with
REST's 4xx `{"error", "detail"}`, and hand the SDK the body they checked. The depth allows the JSON-RPC
envelope (the message, its `params`) on top of what a REST body may nest, so a tool's
arguments meet the same bound as `POST /v1/requests`.
"""

from __future__ import annotations

import json

from starlette.types import Message, Receive, Scope, Send

from api.schemas import check_json_safe
from broker.domain import bounded_json
from broker.domain.errors import InvalidInput

ENVELOPE_DEPTH = 2
"""A JSON-RPC message and its `params` around a tool's `arguments`."""
MAX_DEPTH = bounded_json.MAX_DEPTH + ENVELOPE_DEPTH


async def _body(receive: Receive) -> bytes:
    """The whole body (the app's `BodyLimit` has bounded its size already)."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives `body` once, then whatever the client sends next (a disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _refuse(send: Send, error: InvalidInput) -> None:
    status = 413 if isinstance(error, bounded_json.TooLarge) else 422
    body = json.dumps({"error": error.code, "detail": str(error)}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def checked_body(scope: Scope, receive: Receive, send: Send) -> Receive | None:
    """For a POST: read and check its body; answer a refusal and return None, or return a
    `receive` that hands the SDK the checked body. Any other method passes as it came."""
    if scope.get("method") != "POST":
        return receive
    body = await _body(receive)
    try:
        value = bounded_json.loads(body, "body", max_depth=MAX_DEPTH)
        check_json_safe(value, "body", max_depth=MAX_DEPTH)
    except InvalidInput as error:  # too deep, too large, or JSON the SDK would fail on
        await _refuse(send, error)
        return None
    except ValueError as problem:  # a number past a double, a lone surrogate
        await _refuse(send, InvalidInput(str(problem)))
        return None
    return _replay(body, receive)
