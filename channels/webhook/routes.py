"""Signed decisions from webhook endpoints (`POST /v1/webhooks/{name}/replies`).

The body is verified with the `standardwebhooks` package against every secret in force for the
endpoint (rotation), within its 5-minute window. A `webhook-id` is accepted once: replays get
409 `replayed` with the request. The id is spent in the same atomic step as the decision it
carries, so a malformed body, an impossible decision or an outage half-way don't use it up, and
an honest retry still gets through. An endpoint decides only requests waiting in a queue whose
`channels` list `webhook:NAME`, with the endpoint's `roles`.
"""

from __future__ import annotations

import binascii
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated, Any

from approval_broker_client.models import ConflictBody
from fastapi import APIRouter, Path, Request
from fastapi.responses import Response
from pydantic import BaseModel, Field, ValidationError
from standardwebhooks.webhooks import Webhook, WebhookVerificationError
from starlette.concurrency import run_in_threadpool

from broker.domain.bodies import DecisionBody
from broker.domain.models import Request as BrokerRequest
from broker.domain.principals import Principal
from broker.facade import Once
from broker.judge.deciding import REPLAY_TTL_S
from channels.errors import Refused
from channels.inbound import InboundHost, host_of
from channels.webhook.config import WebhookConfig, webhook_endpoints

log = logging.getLogger("approval_broker.api")

INLINE_BODY = 16 * 1024
"""A reply body up to this size is verified and parsed on the event loop (any real reply is a
few hundred bytes: 20 µs of CPU with its parse, 16 KiB about 35 µs); a larger one in a thread,
so a 1 MiB body (milliseconds of HMAC per secret) can't hold the loop."""
JSON = "application/json"


class WebhookReply(DecisionBody):
    """A signed reply from a webhook endpoint: the request it decides, and who there decided."""

    request_id: str = Field(min_length=1, max_length=200)
    decided_by: str | None = Field(
        default=None,
        min_length=1,
        max_length=100,
        pattern=r"^[^\x00-\x1f/]+$",
        description="the person at the endpoint; recorded as webhook:NAME/PERSON",
    )


def inline_schema(model: type[BaseModel]) -> dict[str, Any]:
    """A model's JSON schema with its `$defs` inlined, for `openapi_extra` request bodies."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref", "")
            if ref.startswith("#/$defs/"):
                rest = {k: v for k, v in node.items() if k != "$ref"}
                return {**resolve(defs[ref.removeprefix("#/$defs/")]), **rest}
            return {k: resolve(v) for k, v in node.items()}
        if isinstance(node, list):
            return [resolve(v) for v in node]
        return node

    resolved: dict[str, Any] = resolve(schema)
    return resolved


router = APIRouter(prefix="/v1/webhooks", tags=["webhooks"])


_VERIFIERS: dict[str, Webhook] = {}


def _verifier(secret: str) -> Webhook:
    """A secret's `Webhook` (decoding the secret is a third of building one), kept."""
    found = _VERIFIERS.get(secret)
    if found is None:
        found = _VERIFIERS[secret] = Webhook(secret)
    return found


def verify(endpoint: WebhookConfig, body: bytes, headers: dict[str, str]) -> None:
    """Raise 401 unless one of the endpoint's secrets signed this body, recently."""
    for secret in endpoint.secrets:
        try:
            _verifier(secret).verify(body, headers, json_parse=False)
            return
        except (WebhookVerificationError, ValueError, binascii.Error):
            continue
        except Exception:  # noqa: BLE001 - a malformed secret in config must not become a 500
            log.warning("webhook secret could not be used to verify (check the config)")
            continue
    raise Refused(401, "bad_signature", "the webhook signature is missing, wrong or too old")


def parse_reply(body: bytes) -> WebhookReply:
    """The reply in `body`, or 422 naming the first field that is wrong."""
    try:  # the common, valid case in one pass; anything else gets the errors as before
        return WebhookReply.model_validate_json(body)
    except (ValueError, RecursionError):
        pass
    try:
        return WebhookReply.model_validate(json.loads(body))
    except RecursionError:
        raise Refused(422, "invalid", "the body is nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        if isinstance(exc, ValidationError):
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            msg = str(first["msg"]).removeprefix("Value error, ")
            detail = f"body.{where}: {msg}" if where else msg
        else:
            detail = "the body is not valid JSON"
        raise Refused(422, "invalid", detail) from None


@dataclass(frozen=True)
class Reply:
    """A verified, parsed reply: who decides, as whom, and its one-time marker."""

    reply: WebhookReply
    decider: Principal
    decided_by: str
    once: Once


def prepare(host: InboundHost, name: str, body: bytes, headers: Iterable[tuple[str, str]]) -> Reply:
    """Verify and parse one reply to endpoint `name` (no Redis)."""
    endpoint = webhook_endpoints(host.config).get(name)
    if endpoint is None:
        raise Refused(404, "not_found", f"no webhook endpoint named {name!r}")
    lowered = {k.lower(): v for k, v in headers}
    verify(endpoint, body, lowered)
    reply = parse_reply(body)
    decider = Principal(f"webhook:{name}", frozenset(endpoint.roles))
    decided_by = decider.name + (f"/{reply.decided_by}" if reply.decided_by else "")
    # the webhook-id is spent in the same atomic step as the decision: a replay is refused, and
    # a reply that failed half-way can be retried with the same id
    once = host.broker.once.marker("webhook", f"{name}:{lowered['webhook-id']}", REPLAY_TTL_S)
    return Reply(reply, decider, decided_by, once)


@router.post(
    "/{name}/replies",
    response_model=None,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": inline_schema(WebhookReply)}},
        }
    },
    responses={
        200: {"model": BrokerRequest, "description": "decided: the request as recorded"},
        409: {"model": ConflictBody, "description": "already decided, or a replayed webhook-id"},
    },
)
async def webhook_reply(
    name: Annotated[str, Path(min_length=1, max_length=200)],
    request: Request,
) -> Response:
    """A decision signed (Standard Webhooks) with endpoint `name`'s secret.

    On the event loop, without a thread hop: the judge's async face (its read and its step on
    redis.asyncio; a rule to remember it runs in a thread itself), and the signature check and
    the parse of a body of up to `INLINE_BODY` bytes (an HMAC per secret in force: microseconds
    at that size). A larger body (up to the API's 1 MiB) is verified and parsed in a thread.
    """
    host = host_of(request)
    body = await request.body()
    headers = request.headers.items()
    if len(body) <= INLINE_BODY:
        given = prepare(host, name, body, headers)
    else:
        given = await run_in_threadpool(prepare, host, name, body, headers)
    reply = given.reply
    done = await host.judge.adecide(
        reply.request_id,
        reply.to_decision(),
        given.decider,
        via=(given.decider.name,),
        decided_by=given.decided_by,
        once=given.once,
        remember=reply.remember,
    )
    return Response(done.request.model_dump_json(), media_type=JSON)
