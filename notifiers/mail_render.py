"""The text of an approval mail, in plain text and HTML, from Jinja2 templates.

Requester text is cleaned before it reaches a mail (`broker.printable`, as in Slack): control
characters and the invisible bidi controls are taken out of the subject and of every name
shown, so a prompt can't fold a header or make a name read backwards; the prompt in the body
keeps its line breaks; in the arguments those characters are shown as `\\uXXXX`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

from broker.config import Config
from broker.models import Request
from broker.printable import BIDI_CONTROLS as BIDI_CONTROLS  # re-exported for tests
from broker.printable import lines, one_line, shown
from notifiers.wording import clip, deciders, title

_env = Environment(
    loader=PackageLoader("notifiers", "templates"),
    autoescape=select_autoescape(enabled_extensions=("html",), default_for_string=False),
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
)

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
    args = shown(json.dumps(request.args, indent=2, ensure_ascii=False))
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
