"""A request as a chat card (text and buttons), for the channels without Block Kit: Telegram and
Discord turn the same `Card` into their own markup (channels/telegram/sender.py, channels/discord/sender.py).

Pure functions of the request and config, so every notifier renders a request the same way and
an update rewrites the whole card. Requester text (prompt, tool name, arguments, reasons,
options) has control and bidi characters removed (`broker.domain.printable`); a channel that reads
markup escapes it as well (Telegram cards are sent as plain text, without `parse_mode`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

from broker.domain.config import Config
from broker.domain.models import Request, Status
from broker.domain.printable import lines, one_line, shown
from broker.domain.questions import answer_text, is_structured
from channels.cards import button_tokens as ids
from channels.cards.answer_options import options_of
from channels.wording import clip, deciders, risk, title

MAX_ARGS = 1500
_OUTCOME = {
    Status.approved: "✅ Approved",
    Status.modified: "✏️ Approved with changed arguments",
    Status.rejected: "⛔ Rejected",
    Status.answered: "💬 Answered",
    Status.timed_out: "⌛ Timed out",
}


@dataclass(frozen=True)
class Button:
    """One button: its label, its token (`channels.cards.button_tokens`) and whether it is the main one."""

    label: str
    token: str
    style: str = "secondary"  # primary | danger | secondary


@dataclass(frozen=True)
class Card:
    text: str
    rows: list[list[Button]] = field(default_factory=list)

    @property
    def tokens(self) -> list[str]:
        return [b.token for row in self.rows for b in row]


def serves(config: Config, channel: str, queue: str) -> bool:
    q = config.queues.get(queue)
    return bool(q and channel in q.channels)


def buttons(request: Request, config: Config) -> list[list[Button]]:
    """The buttons of a request people can still decide, in rows."""
    rid = request.id
    first: list[Button] = []
    if request.kind == "approval":
        first.append(Button("Approve", ids.token(ids.APPROVE, rid), "primary"))
        if request.run_id and request.suggested_rules:
            first.append(Button("Always…", ids.token(ids.ALWAYS, rid)))
    else:
        for i, option in enumerate(options_of(request)):
            first.append(Button(clip(one_line(option), 40), ids.token(ids.OPTION, rid, i)))
    first.append(Button("Reject", ids.token(ids.REJECT, rid), "danger"))
    second = [Button("I'm on it", ids.token(ids.ACK, rid))]
    if config.escalation_target(request.queue):
        second.append(Button("Escalate", ids.token(ids.ESCALATE, rid)))
    rows = [first[i : i + 4] for i in range(0, len(first), 4)]
    return [*rows, second]


def votes_line(request: Request) -> str | None:
    if request.quorum <= 1:
        return None
    names = [one_line(v.by) for v in request.approvals if v.args_hash == request.args_hash]
    line = f"👥 {len(names)} of {request.quorum} approvals"
    return f"{line}: {', '.join(names)}" if names else line


def outcome_lines(request: Request) -> list[str]:
    decision = request.decision
    line = _OUTCOME.get(request.status, request.status.value)
    out = []
    if decision is not None:
        if request.status is not Status.timed_out and decision.decided_by:
            line += f" by {one_line(decision.decided_by)}"
        if decision.decided_at:
            line += f" at {decision.decided_at.strftime('%Y-%m-%d %H:%M UTC')}"
        out.append(line)
        if decision.reason:
            out.append(f"Reason: {clip(lines(decision.reason), 500)}")
        if decision.answer is not None and is_structured(request.metadata):
            out.append(
                "Answer: " + clip(lines(answer_text(request.metadata, decision.answer)), 500)
            )
        elif decision.answer is not None:
            out.append(
                "Answer: " + clip(shown(json.dumps(decision.answer, ensure_ascii=False)), 500)
            )
    else:
        out.append(line)
    return out


def render(
    request: Request, config: Config, channel: str, *, escape: Callable[[str], str] = str
) -> Card:
    """The card for `request` as it stands, as shown in `channel` (`telegram:NAME`, ...).

    `escape` is applied to requester text where the channel reads markup."""
    args = shown(json.dumps(request.args, indent=2, ensure_ascii=False))
    label = risk(request)
    body = [
        f"{title(request)}: {escape(clip(one_line(request.tool_name), 200))}",
        f"⚠️ Risk: {escape(label)}" if label else "",
        escape(clip(lines(request.prompt or ""), 1000)),
        f"Arguments:\n{escape(clip(args, MAX_ARGS))}",
        f"Who may decide: {escape(deciders(config, request))}",
        f"Run: {escape(one_line(request.run_id or '(none)'))} · queue {escape(one_line(request.queue))}"
        f" · request {escape(request.id)}",
    ]
    rows: list[list[Button]] = []
    if not request.is_pending:
        if not serves(config, channel, request.queue):  # a copy left behind by an escalation
            body.append(f"↗️ Escalated to {escape(one_line(request.queue))}")
        body += [escape(line) for line in outcome_lines(request)]
    elif serves(config, channel, request.queue):
        extra = [votes_line(request)]
        if request.acked_by and request.acked_until:
            until = request.acked_until.strftime("%H:%M UTC")
            extra.append(
                f"👀 {one_line(request.acked_by)} is on it (escalation paused until {until})"
            )
        if request.expires_at:
            extra.append(f"Expires {request.expires_at.strftime('%Y-%m-%d %H:%M UTC')}")
        body += [escape(line) for line in extra if line]
        if request.kind != "approval" and not options_of(request):
            body.append("Answer in the inbox (or by REST): this question needs more than a button.")
        rows = buttons(request, config)
    else:
        body.append(f"↗️ Escalated to {escape(one_line(request.queue))}")
    return Card(text="\n\n".join(part for part in body if part), rows=rows)


def fingerprint(request: Request) -> tuple[str, str, str, str]:
    """What a card depends on that can change after it is posted."""
    decided = request.decision.model_dump_json() if request.decision else ""
    votes = ",".join(f"{v.by}={v.args_hash}" for v in request.approvals)
    return request.status.value, request.queue, decided, f"{votes};{request.acked_until}"
