"""The text of an approval mail, in plain text and HTML, from Jinja2 templates.

Requester text is cleaned before it reaches a mail: C0 control characters and the invisible
bidi controls (U+200E/F, U+202A-202E, U+2066-2069) are taken out of the subject and of every
name shown, so a prompt can't fold a header or make a name read backwards; the prompt in the
body keeps its line breaks; in the arguments the bidi controls are shown as `\\uXXXX`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

from broker.config import Config
from broker.models import Request
from notifiers.wording import clip, deciders, title

_env = Environment(
    loader=PackageLoader("notifiers", "templates"),
    autoescape=select_autoescape(enabled_extensions=("html",), default_for_string=False),
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
)

BIDI_CONTROLS = frozenset([0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)])
_CONTROLS = frozenset([*range(0x20), 0x7F])
_ONE_LINE = {c: " " for c in _CONTROLS} | dict.fromkeys(BIDI_CONTROLS)
_LINES = {c: v for c, v in _ONE_LINE.items() if chr(c) not in "\n\t"}
_SHOW_BIDI = {c: f"\\u{c:04x}" for c in BIDI_CONTROLS}


def one_line(text: str) -> str:
    """`text` as one line of visible characters: controls out, whitespace runs made one space."""
    return " ".join(text.translate(_ONE_LINE).split())


def lines(text: str) -> str:
    """`text` without control characters other than line breaks and tabs."""
    return text.replace("\r\n", "\n").translate(_LINES)


_LABELS = {
    "approve": "Approve",
    "approve_run": "Approve, and the same for the rest of this run",
    "reject": "Reject (you will be asked why)",
    "answer": "Answer",
    "escalate": "Escalate",
}


@dataclass(frozen=True)
class Link:
    action: str
    url: str
    target: str | None = None  # where an escalate link moves the request

    @property
    def label(self) -> str:
        base = _LABELS.get(self.action, self.action.title())
        return f"{base} to {self.target}" if self.target else base


def render_mail(
    request: Request,
    config: Config,
    recipient: str,
    links: list[Link],
    links_until: datetime,
    *,
    refusal: str | None = None,
) -> tuple[str, str, str]:
    """(subject, plain text, HTML) of the mail asking `recipient` to decide `request`; with
    `refusal` (why they may not decide it), a mail for their information, without links."""
    args = json.dumps(request.args, indent=2, ensure_ascii=False).translate(_SHOW_BIDI)
    context = {
        "prompt": lines(request.prompt),
        "tool": one_line(request.tool_name),
        "run": one_line(request.run_id) if request.run_id else "(none)",
        "request_id": one_line(request.id),
        "queue": one_line(request.queue),
        "recipient": recipient,
        "links": links,
        "args": clip(args, 20_000),
        "deciders": one_line(deciders(config, request)),
        "expires": request.expires_at.strftime("%Y-%m-%d %H:%M UTC"),
        "links_until": links_until.strftime("%Y-%m-%d %H:%M UTC"),
        "title": title(request),
        "refusal": one_line(refusal) if refusal else None,
    }
    # one line, no controls: no header folding or reversed text from what a requester wrote
    subject = f"[{context['title']}] {clip(one_line(request.prompt or request.tool_name), 120)}"
    text = _env.get_template("mail.txt").render(context)
    html = _env.get_template("mail.html").render(context)
    return subject, text, html
