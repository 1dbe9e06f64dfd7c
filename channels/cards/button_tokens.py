"""The compact button tokens of Telegram and Discord cards, shared by the notifiers (which put
them on buttons) and the API (which reads them back from a click).

Telegram allows 64 bytes of `callback_data` per button (Discord 100 characters of
`custom_id`), so a token is a verb of one or two characters, then `:` and the request id:
`a:req_0190ab...` (approve), `o2:run_....1.0` (answer with option 2), `A0:...` (approve and
keep suggested rule 0). A request id is at most about 45 bytes (`broker.domain.ids`: `run_` + 27
characters, `.ROUND.INDEX`), so every token fits; `token` refuses one that would not rather
than let the platform cut it. What a click may do is decided by the judge, never by the
token: it only names the request and the button.

Plain data only: no platform SDK, no I/O.
"""

from __future__ import annotations

import re

APPROVE = "a"
REJECT = "r"  # asks for the reason first (Telegram: ForceReply; Discord: a modal)
ESCALATE = "e"
ACK = "k"  # "I'm on it"
ALWAYS = "w"  # shows the suggested rules as "Approve always" buttons
ALWAYS_RULE = "A"  # + rule index: approve, and keep that suggested rule
OPTION = "o"  # + option index: answer a question with that option

MAX_TOKEN_BYTES = 64  # Telegram's limit for callback_data, the tighter of the two
_TOKEN = re.compile(r"^(?P<verb>[a-zA-Z])(?P<index>\d{1,2})?:(?P<rid>[A-Za-z0-9_.\-]{1,60})$")


def token(verb: str, request_id: str, index: int | None = None) -> str:
    """The button token for `verb` on `request_id` (with an option or rule `index`)."""
    text = f"{verb}{'' if index is None else index}:{request_id}"
    if len(text.encode()) > MAX_TOKEN_BYTES or not _TOKEN.match(text):
        raise ValueError(f"request id {request_id!r} does not fit a button token")
    return text


def parse(text: str) -> tuple[str, int | None, str] | None:
    """(verb, index or None, request id) of a token; None for anything that is not one."""
    found = _TOKEN.match(text or "")
    if found is None:
        return None
    index = found.group("index")
    return found.group("verb"), int(index) if index is not None else None, found.group("rid")
