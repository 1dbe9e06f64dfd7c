"""Telegram updates (`POST /v1/telegram/updates`, the bot's webhook): the route, which checks
the secret token, parses the update and answers.

- An update counts only with `X-Telegram-Bot-Api-Secret-Token` equal to `[telegram]
  webhook_secret` (the `secret_token` given to setWebhook), compared in constant time; else
  401 and nothing is read.
- A button click (callback query) goes to `channels.cards.clicks` and is answered at once, in the
  webhook's own response (`{"method": "answerCallbackQuery", ...}`, which the Bot API allows
  for webhooks): the clicker sees "Done", why not, or who decided first.
- Reject asks for the reason: the bot sends a ForceReply prompt, remembered for an hour
  (`broker.reason_prompts`), and the clicker's reply to it completes the rejection.
- Each update is handled once: its `update_id` marker is spent with the decision it carries
  (a redelivered update decides nothing twice), or here when it decides nothing.

Updating the cards after a decision is the notifiers' job (they see the event).
"""

from __future__ import annotations

import hmac
import logging
from typing import Any

import httpx
from approval_broker_client.models import ErrorBody
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from broker.domain.printable import one_line
from broker.facade import Once
from channels.cards import button_tokens as ids
from channels.cards import clicks
from channels.cards.clicks import ClickResult, Result
from channels.errors import Refused
from channels.inbound import Host, InboundHost
from channels.telegram.config import TelegramConfig, telegram_section
from channels.telegram.updates import CallbackQuery, Message, Update, parse_update
from channels.wording import rule_text

log = logging.getLogger("approval_broker.api")

router = APIRouter(prefix="/v1/telegram", tags=["telegram"])

SECRET_HEADER = "x-telegram-bot-api-secret-token"
UPDATE_TTL_S = 24 * 3600  # Telegram gives up redelivering an update well within a day
PROMPT_TTL_S = 3600  # how long a Reject waits for its reason
BOT_API_TIMEOUT_S = 5.0
MAX_ANSWER = 200  # answerCallbackQuery's text limit


def verify(telegram: TelegramConfig, given: str | None) -> None:
    """401 unless the secret token is the configured one (constant-time)."""
    if not given or not hmac.compare_digest(given.encode(), telegram.webhook_secret.encode()):
        raise Refused(401, "bad_secret", "the Telegram secret token is missing or wrong")


def chats_of(telegram: TelegramConfig, chat_id: int) -> list[str]:
    """The configured channels (`telegram:NAME`) that a Telegram chat id stands for."""
    return [f"telegram:{n}" for n, c in telegram.chats.items() if str(c.chat_id) == str(chat_id)]


def bot_call(telegram: TelegramConfig, method: str, payload: dict[str, Any]) -> dict[str, Any]:
    """One Bot API call; its `result`, or httpx.HTTPError / ValueError."""
    url = f"{telegram.api_base_url.rstrip('/')}/bot{telegram.bot_token}/{method}"
    response = httpx.post(url, json=payload, timeout=BOT_API_TIMEOUT_S)
    data = response.json()
    if not data.get("ok"):
        raise ValueError(f"Telegram refused {method}: {data.get('description')}")
    result: dict[str, Any] = data.get("result") or {}
    return result


def answer(query: CallbackQuery, text: str, *, alert: bool = False) -> dict[str, Any]:
    """The webhook response that answers the callback query (stops the button's spinner)."""
    return {
        "method": "answerCallbackQuery",
        "callback_query_id": query.id,
        "text": one_line(text)[:MAX_ANSWER],
        "show_alert": alert,
    }


def say(message: Message, text: str) -> dict[str, Any]:
    """The webhook response that replies in the chat to `message`."""
    return {
        "method": "sendMessage",
        "chat_id": message.chat.id,
        "text": one_line(text)[:1000],
        "reply_parameters": {"message_id": message.message_id},
    }


def ask_reason(
    host: InboundHost, telegram: TelegramConfig, query: CallbackQuery, result: ClickResult
) -> dict[str, Any]:
    """Send the ForceReply prompt and remember which request and user it is for."""
    request, message = result.request, query.message
    assert request is not None and message is not None
    try:
        sent = bot_call(
            telegram,
            "sendMessage",
            {
                "chat_id": message.chat.id,
                "text": f"Why reject {one_line(request.tool_name)[:100]}? Reply to this message"
                " with the reason.",
                "reply_markup": {"force_reply": True, "input_field_placeholder": "Reason"},
                "reply_parameters": {"message_id": message.message_id},
            },
        )
        prompt = f"{message.chat.id}:{int(sent['message_id'])}"
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        log.warning("could not ask for a Telegram reject reason: %s", type(exc).__name__)
        return answer(query, "Could not ask for the reason; please try again.", alert=True)
    record = {"request_id": request.id, "user_id": query.from_.id}
    host.broker.reason_prompts.keep("telegram", prompt, record, PROMPT_TTL_S)
    return answer(query, "Reply to my message with the reason.")


def show_rules(
    telegram: TelegramConfig, query: CallbackQuery, result: ClickResult
) -> dict[str, Any]:
    """Always…: a message with one "Approve always" button per suggested rule."""
    request, message = result.request, query.message
    assert request is not None and message is not None
    keyboard = [
        [
            {
                "text": one_line("Approve always: " + rule_text(rule))[:60],
                "callback_data": ids.token(ids.ALWAYS_RULE, request.id, i),
            }
        ]
        for i, rule in enumerate(request.suggested_rules[:5])
    ]
    try:
        bot_call(
            telegram,
            "sendMessage",
            {
                "chat_id": message.chat.id,
                "text": "Approve, and decide the same way later for:",
                "reply_markup": {"inline_keyboard": keyboard},
                "reply_parameters": {"message_id": message.message_id},
            },
        )
    except (httpx.HTTPError, ValueError) as exc:
        log.warning("could not show Telegram rule buttons: %s", type(exc).__name__)
        return answer(query, "Could not show the rules; please try again.", alert=True)
    return answer(query, result.text)


def on_click(
    host: InboundHost, telegram: TelegramConfig, query: CallbackQuery, once: Once
) -> dict[str, Any]:
    if query.message is None or not query.data:
        return answer(query, "This message is too old to act on.", alert=True)
    via = chats_of(telegram, query.message.chat.id)
    result = clicks.click(host, "telegram", query.data, str(query.from_.id), via, once)
    if result.result is Result.ask_reason:
        return ask_reason(host, telegram, query, result)
    if result.result is Result.always:
        return show_rules(telegram, query, result)
    return answer(query, result.text, alert=result.result is Result.refused)


def on_reply(
    host: InboundHost, telegram: TelegramConfig, message: Message, once: Once
) -> dict[str, Any]:
    """A reply to a ForceReply prompt: the reason of a pending Reject (else ignored)."""
    if message.reply_to_message is None or message.from_ is None:
        return {}
    prompt = f"{message.chat.id}:{message.reply_to_message.message_id}"
    record = host.broker.reason_prompts.read("telegram", prompt)
    if record is None:
        return {}
    if record.get("user_id") != message.from_.id:
        return say(message, "Only the one who clicked Reject can give its reason.")
    result = clicks.reject(
        host,
        "telegram",
        str(record.get("request_id")),
        message.text or "",
        str(message.from_.id),
        chats_of(telegram, message.chat.id),
        once,
    )
    if result.result is Result.decided:
        host.broker.reason_prompts.drop("telegram", prompt)
    return say(message, "Rejected." if result.result is Result.decided else result.text)


def handle(
    host: InboundHost, telegram: TelegramConfig, update: Update, once: Once
) -> dict[str, Any]:
    """The webhook response for one update (a Bot API method call, or {} for nothing)."""
    if update.callback_query is not None:
        return on_click(host, telegram, update.callback_query, once)
    if update.message is not None:
        return on_reply(host, telegram, update.message, once)
    return {}


@router.post(
    "/updates",
    response_model=None,
    responses={
        200: {"description": "handled; the body may be a Bot API call (answerCallbackQuery)"},
        400: {"model": ErrorBody},
        401: {"model": ErrorBody, "description": "missing or wrong secret token"},
    },
)
async def telegram_updates(request: Request, host: Host) -> JSONResponse:
    """A Telegram update: an inline button clicked, or a reply giving a reject reason."""
    telegram = telegram_section(host.config)
    if telegram is None:
        raise Refused(404, "not_configured", "Telegram is not configured")
    verify(telegram, request.headers.get(SECRET_HEADER))
    update = parse_update(await request.body())
    once = host.broker.once.marker("telegram", str(update.update_id), UPDATE_TTL_S)
    if await run_in_threadpool(host.broker.once.spent, once):
        return JSONResponse({})  # handled before: Telegram redelivers until it hears 200
    body = await run_in_threadpool(handle, host, telegram, update, once)
    await run_in_threadpool(host.broker.once.spend, once)
    return JSONResponse(body)
