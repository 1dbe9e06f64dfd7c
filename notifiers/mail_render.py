"""The text of an approval mail, in plain text and HTML, from Jinja2 templates."""

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

_LABELS = {
    "approve": "Approve",
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
    request: Request, config: Config, recipient: str, links: list[Link], links_until: datetime
) -> tuple[str, str, str]:
    """(subject, plain text, HTML) of the mail asking `recipient` to decide `request`."""
    context = {
        "request": request,
        "recipient": recipient,
        "links": links,
        "args": clip(json.dumps(request.args, indent=2, ensure_ascii=False), 20_000),
        "deciders": deciders(config, request),
        "expires": request.expires_at.strftime("%Y-%m-%d %H:%M UTC"),
        "links_until": links_until.strftime("%Y-%m-%d %H:%M UTC"),
        "title": title(request),
    }
    subject = f"[{context['title']}] {clip(request.prompt or request.tool_name, 120)}"
    subject = " ".join(subject.split())  # no header folding tricks from a prompt's newlines
    text = _env.get_template("mail.txt").render(context)
    html = _env.get_template("mail.html").render(context)
    return subject, text, html
