"""Text made safe to print on a terminal or record as a name.

A request's prompt and args, or a person's name sent by a webhook, come from outside. Control
characters (C0, DEL, C1) can move a terminal's cursor or forge lines, and bidirectional
overrides can make text read differently from what it holds; both are removed here.
"""

from __future__ import annotations

import re

_WHITESPACE = re.compile(r"[\t\n\r\v\f]+")
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """`text` without control or bidi-override characters; line breaks and tabs become a space."""
    return _UNSAFE.sub("", _WHITESPACE.sub(" ", text))
