"""The shapes of the Telegram updates the broker reads, and the JSON body it reads them from.

Only the fields used are modelled (a callback query from an inline button, a message replying
to the bot's ForceReply prompt); anything else Telegram sends is ignored. A body that is not a
JSON object within `broker.domain.bounded_json`'s limits, or an update of the wrong shape (ids
past 64 bits, texts longer than Telegram allows), is a 400.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from broker.domain import bounded_json
from broker.domain.errors import InvalidInput
from channels.errors import Refused

Id = Annotated[int, Field(ge=-(2**63), lt=2**63)]
"""Telegram's ids fit in 64 bits (chat ids in 52): 400 digits are no id."""
MAX_TEXT = 4096  # a message's text, as the Bot API limits it
MAX_QUERY_ID = 256
MAX_DATA = 256  # a button's callback_data is 1 to 64 bytes


class _Shape(BaseModel):
    model_config = ConfigDict(populate_by_name=True)


class User(_Shape):
    id: Id


class Chat(_Shape):
    id: Id


class ReplyTo(_Shape):
    message_id: Id


class Message(_Shape):
    message_id: Id
    chat: Chat
    from_: User | None = Field(default=None, alias="from")  # absent in channels
    text: str | None = Field(default=None, max_length=MAX_TEXT)
    reply_to_message: ReplyTo | None = None


class CallbackQuery(_Shape):
    id: str = Field(max_length=MAX_QUERY_ID)
    from_: User = Field(alias="from")
    message: Message | None = None  # absent when the message is too old
    data: str | None = Field(default=None, max_length=MAX_DATA)


class Update(_Shape):
    update_id: Id
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
