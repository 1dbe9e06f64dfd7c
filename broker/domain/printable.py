"""Text made safe to show or record: one set of rules for every channel and the terminal.

A request's prompt, tool name, args and questions, or a person's name sent by a webhook, come
from outside. Control characters (C0, DEL, C1) can move a terminal's cursor, fold a mail
header or forge lines, and bidirectional controls (U+061C, U+200E/F, U+202A-202E,
U+2066-2069) make text read differently from what it holds (`wire\\u202emoney`). Email, Slack
and the CLI clean requester text with these functions, so a text reads the same everywhere.
"""

from __future__ import annotations

import re

BIDI_CONTROLS = frozenset([0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)])
CONTROLS = frozenset([*range(0x20), *range(0x7F, 0xA0)])
_ONE_LINE = {c: " " for c in CONTROLS} | dict.fromkeys(BIDI_CONTROLS)
_LINES = {c: v for c, v in _ONE_LINE.items() if chr(c) not in "\n\t"}
_SHOWN = {c: f"\\u{c:04x}" for c in BIDI_CONTROLS | CONTROLS if chr(c) not in "\n\t"}

_WHITESPACE = re.compile(r"[\t\n\r\v\f]+")
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """`text` without control or bidi-override characters; line breaks and tabs become a space."""
    return _UNSAFE.sub("", _WHITESPACE.sub(" ", text))


def one_line(text: str) -> str:
    """`text` as one line of visible characters: controls out, whitespace runs made one space."""
    return " ".join(text.translate(_ONE_LINE).split())


def lines(text: str) -> str:
    """`text` without control or bidi characters other than line breaks and tabs."""
    return text.replace("\r\n", "\n").translate(_LINES)


def shown(text: str) -> str:
    """`text` with its control and bidi characters written out as `\\uXXXX` (line breaks and
    tabs kept): for JSON shown to people, where what was sent must stay visible."""
    return text.translate(_SHOWN)
