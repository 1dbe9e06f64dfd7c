"""What Teams sends, checked before the Microsoft 365 Agents SDK sees it: the Bot Framework
token's shape, and the activity's size, depth, types and the card action it carries.

The SDK's validator reads the token's header and looks its `kid` up without asking whether
there is one (a token without one was a 500), and its router answers an invoke it has no
handler for with an empty 501; a body nested thousands deep, or an activity without a service
URL, failed inside it with a 500. Each of those is a 401 or 400 `{"error", "detail"}` here.
Only PyJWT's public reading of an unverified token is used: the signature, issuer, expiry and
audience are still the SDK's to check. Nothing here decides or speaks to Teams.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import jwt
from microsoft_agents.activity import Activity
from pydantic import ValidationError

from broker.domain import bounded_json
from broker.domain.errors import InvalidInput
from channels.errors import Refused
from channels.teams import adaptive_cards as cards

MAX_TOKEN = 16 * 1024
"""A Bot Framework token is about 1.5 KB; anything past this is not one."""
MAX_KID = 256
TOKEN_ALGORITHM = "RS256"  # what the SDK verifies Bot Framework and Entra tokens with
MAX_URL = 2048
MAX_INPUT = 10_000
"""A card input's text: the reason input holds 2,000, a Decision's reason 10,000."""
MAX_INPUTS = 64
CARD_ACTION = "adaptiveCard/action"


def refused_token(detail: str) -> Refused:
    return Refused(401, "unauthorized", detail)


def check_token(token: str, app_id: str | None) -> None:
    """401 unless `token` is shaped as a Bot Framework token for `app_id`: three segments of
    base64url JSON objects, signed with RS256 under a key id, for our app as audience. An
    anonymous bot (no app id) has no audience a token could name."""
    if len(token) > MAX_TOKEN:
        raise refused_token("the Bot Framework token is too long")
    try:
        header = jwt.get_unverified_header(token)
        claims = jwt.decode(token, options={"verify_signature": False})
    except (jwt.PyJWTError, ValueError, TypeError):
        raise refused_token("the Bot Framework token is not a JWT") from None
    if header.get("alg") != TOKEN_ALGORITHM:
        raise refused_token(f"the Bot Framework token must be signed with {TOKEN_ALGORITHM}")
    kid = header.get("kid")
    if not isinstance(kid, str) or not 0 < len(kid) <= MAX_KID:
        raise refused_token("the Bot Framework token names no signing key (kid)")
    audience = claims.get("aud")
    if not app_id or not isinstance(audience, str) or audience.casefold() != app_id.casefold():
        raise refused_token("the Bot Framework token is not for this bot")


def bad(detail: str) -> Refused:
    return Refused(400, "bad_request", detail)


def check_activity(body: bytes) -> dict[str, Any]:
    """The activity as JSON, once it is one the SDK can take without failing; else 400."""
    try:
        raw = bounded_json.loads(body, "activity")
    except (bounded_json.TooDeep, bounded_json.TooLarge) as exc:
        raise bad(exc.detail) from None
    except InvalidInput:
        raise bad("the body is not a Bot Framework activity (JSON)") from None
    if not isinstance(raw, dict):
        raise bad("the body is not a Bot Framework activity")
    try:
        activity = Activity.model_validate(raw)
    except (ValidationError, ValueError, TypeError):  # the SDK's own checks raise TypeError too
        raise bad("the body is not a Bot Framework activity") from None
    if not activity.type or not activity.conversation or not activity.conversation.id:
        raise bad("an activity needs a type and conversation.id")
    sender, bot = activity.from_property, activity.recipient
    if not activity.channel_id or not sender or not sender.id or not bot or not bot.id:
        # the SDK keys its turn state by channel and sender, and answers through the recipient
        raise bad("an activity needs a channelId, from.id and recipient.id")
    check_service_url(activity.service_url)
    if activity.type == "invoke":
        if activity.name != CARD_ACTION:
            raise bad(f"the bot answers only {CARD_ACTION} invokes")
        check_card_action(raw.get("value"))
    return raw


def check_service_url(url: object) -> None:
    """Where the SDK would answer: an http(s) URL with a host."""
    if not isinstance(url, str) or not url or len(url) > MAX_URL:
        raise bad("an activity needs a serviceUrl")
    try:
        parts = urlsplit(url)
        fine = parts.scheme in ("http", "https") and bool(parts.hostname)
    except ValueError:  # e.g. an unclosed [IPv6 host
        fine = False
    if not fine:
        raise bad("the activity's serviceUrl is not an http(s) URL")


def check_card_action(value: object) -> None:
    """An `Action.Execute` of one of our verbs, whose data holds only short scalar inputs."""
    if not isinstance(value, dict) or not isinstance(value.get("action"), dict):
        raise bad(f"an {CARD_ACTION} invoke's value must be an object with an action")
    action = value["action"]
    if action.get("type") != "Action.Execute":
        raise bad("the card action is not an Action.Execute")
    verb = action.get("verb")
    if not isinstance(verb, str) or verb not in cards.VERBS:
        raise bad(f"the card action's verb must be one of {', '.join(cards.VERBS)}")
    data = action.get("data")
    if not isinstance(data, dict) or len(data) > MAX_INPUTS:
        raise bad(f"the card action's data must be an object of at most {MAX_INPUTS} inputs")
    for item in data.values():
        if isinstance(item, dict | list):
            raise bad("the card action's inputs must be text, numbers or booleans")
        if isinstance(item, str) and len(item) > MAX_INPUT:
            raise bad(f"a card input holds at most {MAX_INPUT} characters")
