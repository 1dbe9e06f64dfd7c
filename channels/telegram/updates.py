"""The shapes of the Telegram updates the broker reads, and the JSON body it reads them from.

Only the fields used are modelled (a callback query from an inline button, a message replying
to the bot's ForceReply prompt); anything else Telegram sends is ignored. A body that is not a
JSON object within `broker.domain.bounded_json`'s limits, or an update of the wrong shape, is a 400.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from broker.domain import bounded_json
from broker.domain.errors import InvalidInput
from channels.errors import Refused


class _Shape(BaseModel):
    model_config = ConfigDict(populate_by_name=True)


class User(_Shape):
    id: int


class Chat(_Shape):
    id: int


class ReplyTo(_Shape):
    message_id: int


class Message(_Shape):
    message_id: int
    chat: Chat
    from_: User | None = Field(default=None, alias="from")  # absent in channels
    text: str | None = None
    reply_to_message: ReplyTo | None = None


class CallbackQuery(_Shape):
    id: str
    from_: User = Field(alias="from")
    message: Message | None = None  # absent when the message is too old
    data: str | None = None


class Update(_Shape):
    update_id: int
    callback_query: CallbackQuery | None = None
    message: Message | None = None


def parse_update(body: bytes) -> Update:
    """The update in the body; else 400."""
    try:
        raw = bounded_json.loads(body, "update")
    except (bounded_json.TooDeep, bounded_json.TooLarge) as exc:
        raise Refused(400, "bad_request", exc.detail) from None
    except InvalidInput:
        raise Refused(400, "bad_request", "the body must be a Telegram Update (JSON)") from None
    if not isinstance(raw, dict):
        raise Refused(400, "bad_request", "the body must be a JSON object")
    try:
        return Update.model_validate(raw)
    except ValidationError:
        raise Refused(400, "bad_request", "malformed Telegram update") from None
