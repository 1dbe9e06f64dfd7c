"""FakeChat's webhook (`POST /v1/fakechat/events`): a button pressed in a room, signed by the
service with Standard Webhooks, checked, and handed to the judge through `channels.cards.clicks`.

- The signature is checked with the `standardwebhooks` package against `[fakechat]
  signing_secret`; a wrong one, or a timestamp more than 5 minutes off, is 401 and nothing is
  read.
- The room names the channel the press came through (`fakechat:NAME` whose room it is); the
  pressing user is an approver only if one has that `fakechat_user_id`.
- The `webhook-id` is the press's one-time marker: spent with the decision it carries (or here
  when it carries none), so a replayed press, even one with another body, is 409 `replayed`.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from standardwebhooks.webhooks import Webhook, WebhookVerificationError
from starlette.concurrency import run_in_threadpool

from broker.domain import bounded_json
from broker.domain.errors import InvalidInput
from broker.facade import Once
from broker.judge.deciding import REPLAY_TTL_S
from channels.cards import button_tokens as ids
from channels.cards import clicks
from channels.cards.clicks import ClickResult
from channels.errors import Refused
from channels.inbound import Host, InboundHost
from tests.support.fakechat.config import FakeChatConfig, fakechat_section

router = APIRouter(prefix="/v1/fakechat", tags=["fakechat"])


class Press(BaseModel):
    """What the service sends when someone presses a button under one of our messages."""

    model_config = ConfigDict(extra="ignore")

    room: str = Field(min_length=1, max_length=64)
    user: str = Field(min_length=1, max_length=64)
    button: str = Field(min_length=1, max_length=64)
    reason: str | None = Field(default=None, max_length=10_000)
    """The text typed with Reject (the service asks for it before it sends the press)."""


def verify(section: FakeChatConfig, body: bytes, headers: dict[str, str]) -> None:
    """401 unless the service signed this body with our secret, within 5 minutes."""
    try:
        Webhook(section.signing_secret).verify(body, headers, json_parse=False)
    except (WebhookVerificationError, ValueError):
        raise Refused(401, "bad_signature", "the FakeChat signature is wrong or too old") from None


def parse(body: bytes) -> Press:
    try:
        return Press.model_validate(bounded_json.loads(body, "press"))
    except (InvalidInput, ValidationError):
        raise Refused(400, "bad_request", "the body is not a FakeChat press") from None


def answer(result: ClickResult) -> dict[str, Any]:
    """What the service shows the presser (their eyes only): the outcome, or why not."""
    return {"result": result.result.value, "text": result.text}


def handle(host: InboundHost, section: FakeChatConfig, press: Press, once: Once) -> ClickResult:
    via = [f"fakechat:{name}" for name, r in section.rooms.items() if r.room == press.room]
    parsed = ids.parse(press.button)
    if press.reason is not None and parsed is not None and parsed[0] == ids.REJECT:
        return clicks.reject(host, "fakechat", parsed[2], press.reason, press.user, via, once)
    return clicks.click(host, "fakechat", press.button, press.user, via, once)


@router.post("/events", response_model=None)
async def fakechat_events(request: Request, host: Host) -> JSONResponse:
    """A button pressed under one of our messages."""
    section = fakechat_section(host.config)
    if section is None:
        raise Refused(404, "not_configured", "FakeChat is not configured")
    body = await request.body()
    headers = {k.lower(): v for k, v in request.headers.items()}
    verify(section, body, headers)
    press = parse(body)
    once = host.broker.once.marker("fakechat", headers["webhook-id"][:64], REPLAY_TTL_S)
    if await run_in_threadpool(host.broker.once.spent, once):
        raise Refused(409, "replayed", "this FakeChat press was already received")
    result = await run_in_threadpool(handle, host, section, press, once)
    await run_in_threadpool(host.broker.once.spend, once)
    return JSONResponse(answer(result))
