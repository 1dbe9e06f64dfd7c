"""The text of an approval mail, in plain text and HTML, from Jinja2 templates.

Requester text is cleaned before it reaches a mail (`broker.domain.printable`, as in Slack): control
characters and the invisible bidi controls are taken out of the subject and of every name
shown, so a prompt can't fold a header or make a name read backwards; the prompt in the body
keeps its line breaks; in the arguments those characters are shown as `\\uXXXX`.

A mail's size is bounded whatever the request holds: the arguments are shown up to
`MAX_ARGS_SHOWN` characters and the prompt up to `MAX_PROMPT_SHOWN`, each cut with "…" and a
note saying how much more there is and where to read all of it (the page each link opens, and
the inbox at the email config's `public_url`). The plain-text and HTML parts carry the same
cut text, so one mail is a few tens of KiB at most.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

from broker.domain.config import Config
from broker.domain.models import Request
from broker.domain.printable import BIDI_CONTROLS as BIDI_CONTROLS  # re-exported for tests
from broker.domain.printable import lines, one_line, shown
from channels.email.config import email_section
from channels.wording import clip, deciders, risk, title

_env = Environment(
    loader=PackageLoader("channels.email", "templates"),
    autoescape=select_autoescape(enabled_extensions=("html",), default_for_string=False),
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
)

MAX_ARGS_SHOWN = 4000
"""Characters of the arguments' JSON a mail shows; the rest is on the request's pages."""
MAX_PROMPT_SHOWN = 8000
"""Characters of the prompt a mail shows."""


def _cut(text: str, limit: int) -> tuple[str, int]:
    """(`text` clipped to `limit` characters with "…", how many characters were left out)."""
    if len(text) <= limit:
        return text, 0
    return clip(text, limit), len(text) - (limit - 1)


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
    args, args_cut = _cut(
        shown(json.dumps(request.args, indent=2, ensure_ascii=False)), MAX_ARGS_SHOWN
    )
    prompt, prompt_cut = _cut(lines(request.prompt), MAX_PROMPT_SHOWN)
    public = (
        email.public_url if (email := email_section(config)) else "http://127.0.0.1:8000"
    ).rstrip("/")
    context = {
        "prompt": prompt,
        "prompt_cut": prompt_cut,
        "args_cut": args_cut,
        "inbox_url": f"{public}/",
        "tool": one_line(request.tool_name),
        "run": one_line(request.run_id) if request.run_id else "(none)",
        "request_id": one_line(request.id),
        "queue": one_line(request.queue),
        "recipient": recipient,
        "links": links,
        "args": args,
        "deciders": one_line(deciders(config, request)),
        "expires": request.expires_at.strftime("%Y-%m-%d %H:%M UTC"),
        "links_until": links_until.strftime("%Y-%m-%d %H:%M UTC"),
        "title": title(request),
        "risk": risk(request),
        "refusal": one_line(refusal) if refusal else None,
    }
    # one line, no controls: no header folding or reversed text from what a requester wrote
    label = risk(request)
    marked = f"[risk: {clip(label, 40)}] " if label else ""
    subject = (
        f"[{context['title']}] {marked}{clip(one_line(request.prompt or request.tool_name), 120)}"
    )
    text = _env.get_template("mail.txt").render(context)
    html = _env.get_template("mail.html").render(context)
    return subject, text, html
