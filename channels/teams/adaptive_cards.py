"""The Adaptive Card of one request in Microsoft Teams: what the tool wants to do, who may
decide, and its `Action.Execute` buttons; or, once decided, the outcome.

Pure functions of the request and config (like `channels.slack.blocks`), used by the
notifier that posts and updates the card and by the API, which answers a click with the card
refreshed (the invoke response). Nothing here decides or speaks HTTP.

Requester text (prompt, tool name, arguments, reasons, questions and options) goes into
`TextRun`s of `RichTextBlock`s and into plain input labels, never into a `TextBlock`, which
Teams reads as markdown: a prompt saying `[bank.com](https://evil)` shows as written, inert.
Control and bidi characters are dropped first (`broker.domain.printable`), as every channel does;
in the arguments they are shown as `\\uXXXX`.

Inputs are named as every channel's forms are (`channels.answer_forms`): question `i`'s choices
`q{i}` (option indices), its own words `q{i}_other`; an open answer `answer`; the reason
`reason`.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from broker.domain.config import Config
from broker.domain.models import HistoryEntry, Request, Status
from broker.domain.printable import lines, one_line, shown
from broker.domain.questions import answer_text, is_structured, questions_of
from channels.answer_forms import other_input, question_input
from channels.wording import risk

Element = dict[str, Any]

CARD_VERSION = "1.4"  # Action.Execute (Universal Actions) needs 1.4
APPROVE, REJECT, ANSWER, ESCALATE = "approve", "reject", "answer", "escalate"
VERBS = (APPROVE, REJECT, ANSWER, ESCALATE)
REASON_INPUT = "reason"
ANSWER_INPUT = "answer"
MAX_TEXT = 3000
MAX_OPTIONS = 20
TITLES = {"approval": "Approval needed", "question": "Question", "external": "Result needed"}
OUTCOME_LINE = {
    Status.approved: "Approved",
    Status.modified: "Approved with changed arguments",
    Status.rejected: "Rejected",
    Status.answered: "Answered",
    Status.timed_out: "Timed out",
}


def clip(text: str, limit: int = MAX_TEXT) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def literal(text: str, **style: Any) -> Element:
    """A block of text Teams shows as written (a TextRun is never read as markdown)."""
    run = {"type": "TextRun", "text": clip(lines(text)), **style}
    return {"type": "RichTextBlock", "inlines": [run]}


def when(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M UTC")


def person(config: Config, name: str | None) -> str:
    """How a decider is named on the card (the sweeper by its role, a person by name)."""
    if not name:
        return "someone"
    return "the sweeper" if name == "sweeper" else one_line(name)


def deciders(config: Config, request: Request) -> str:
    if not request.allowed_roles:
        return "any approver"
    return "people with role " + " or ".join(one_line(r) for r in request.allowed_roles)


def options_of(request: Request) -> list[str]:
    """The choices of an open question (`metadata.options`), when there are few enough."""
    raw = request.metadata.get("options")
    if not isinstance(raw, list):
        return []
    opts = [str(o) for o in raw if isinstance(o, str | int | float) and not isinstance(o, bool)]
    if not opts or len(opts) > MAX_OPTIONS or any(len(o) > 200 for o in opts):
        return []
    return opts


def describe(request: Request, config: Config) -> list[Element]:
    """The part that never changes: title, prompt, the tool call and its context."""
    args = shown(json.dumps(request.args, indent=2, ensure_ascii=False))
    facts = [
        ("Tool", one_line(request.tool_name)),
        ("Run", one_line(request.run_id) if request.run_id else "(none)"),
        ("Who may decide", deciders(config, request)),
        ("Expires", when(request.expires_at)),
    ]
    body: list[Element] = [
        literal(TITLES.get(request.kind, "Request"), weight="Bolder", size="Medium"),
    ]
    label = risk(request)
    if label:
        body.append(literal(f"Risk: {label}", weight="Bolder", color="Attention"))
    body.append(literal(request.prompt or request.tool_name))
    body += [literal(f"{name}: {clip(value, 500)}", isSubtle=True) for name, value in facts]
    body.append(literal(args, fontType="Monospace"))
    return body


def execute(title: str, verb: str, request: Request, style: str | None = None) -> Element:
    """An `Action.Execute` button; its data names the request (and the card's inputs join it)."""
    action: Element = {
        "type": "Action.Execute",
        "title": title,
        "verb": verb,
        "data": {"request_id": request.id},
    }
    if style:
        action["style"] = style
    return action


def answer_inputs(request: Request) -> list[Element] | None:
    """The inputs a question is answered with; None when the card can't hold its form (an
    answer schema: answered in the inbox)."""
    questions = questions_of(request.metadata)
    if questions is not None:
        out: list[Element] = []
        for i, q in enumerate(questions):
            out.append(literal(q.question, weight="Bolder"))
            if q.context:
                out.append(literal(q.context, isSubtle=True))
            out.append(
                {
                    "type": "Input.ChoiceSet",
                    "id": question_input(i),
                    "style": "expanded",
                    "isMultiSelect": q.multi_select,
                    "choices": [
                        {"title": clip(one_line(o.label), 200), "value": str(j)}
                        for j, o in enumerate(q.options)
                    ],
                }
            )
            out.append({"type": "Input.Text", "id": other_input(i), "placeholder": "Other"})
        return out
    if is_structured(request.metadata):
        return None
    options = options_of(request)
    if options:
        choices = [{"title": clip(one_line(o), 200), "value": o} for o in options]
        return [{"type": "Input.ChoiceSet", "id": ANSWER_INPUT, "choices": choices}]
    return [{"type": "Input.Text", "id": ANSWER_INPUT, "placeholder": "Your answer"}]


def actions(request: Request, config: Config) -> tuple[list[Element], list[Element]]:
    """(inputs, buttons) for a request people can still decide here."""
    inputs: list[Element] = []
    buttons: list[Element] = []
    if request.kind == "approval":
        buttons.append(execute("Approve", APPROVE, request, "positive"))
    else:
        form = answer_inputs(request)
        if form is None:
            inputs.append(literal("Answer this request's form in the inbox.", isSubtle=True))
        else:
            inputs += form
            buttons.append(execute("Answer", ANSWER, request, "positive"))
    inputs.append(
        {
            "type": "Input.Text",
            "id": REASON_INPUT,
            "placeholder": "Reason (needed to reject)",
            "isMultiline": True,
            "maxLength": 2000,
        }
    )
    buttons.append(execute("Reject", REJECT, request, "destructive"))
    if config.escalation_target(request.queue):
        buttons.append(execute("Escalate", ESCALATE, request))
    return inputs, buttons


def progress(request: Request, config: Config) -> list[Element]:
    """Votes so far (where several are needed) and who is on it."""
    out: list[Element] = []
    if request.quorum > 1:
        names = [person(config, v.by) for v in request.approvals]
        line = f"{len(names)} of {request.quorum} approvals"
        out.append(literal(f"{line}: {', '.join(names)}" if names else line))
    if request.acked_by and request.acked_until:
        out.append(
            literal(
                f"{person(config, request.acked_by)} is on it (escalation paused until"
                f" {when(request.acked_until)})"
            )
        )
    return out


def outcome(request: Request, config: Config) -> list[Element]:
    """Who decided what and when, for a request that is no longer pending."""
    decision = request.decision
    line = OUTCOME_LINE.get(request.status, request.status.value)
    out: list[Element] = []
    if decision is not None:
        if request.status is not Status.timed_out:
            line += f" by {person(config, decision.decided_by)}"
        if decision.decided_at:
            line += f" at {when(decision.decided_at)}"
    color = "Good" if request.status in (Status.approved, Status.modified) else "Attention"
    if request.status is Status.answered:
        color = "Good"
    out.append(literal(line, weight="Bolder", color=color))
    if decision is None:
        return out
    if decision.reason:
        out.append(literal(f"Reason: {decision.reason}"))
    if decision.args is not None:
        out.append(
            literal("New arguments: " + shown(json.dumps(decision.args, ensure_ascii=False)))
        )
    if decision.answer is not None:
        read = (
            answer_text(request.metadata, decision.answer)
            if is_structured(request.metadata)
            else json.dumps(decision.answer, ensure_ascii=False)
        )
        out.append(literal(f"Answer: {shown(read)}"))
    return out


def _last_escalation(request: Request) -> HistoryEntry | None:
    return next((h for h in reversed(request.history) if h.event == "escalated"), None)


def moved(request: Request, config: Config) -> list[Element]:
    """For a channel the request has left: where it went, who moved it, when and why."""
    move = _last_escalation(request)
    line = f"Escalated to {one_line(request.queue)}"
    if move is not None:
        line += f" by {person(config, move.by)} at {when(move.at)}"
        if move.reason:
            line += f": {move.reason}"
    return [literal(line, weight="Bolder")]


def card(body: list[Element], buttons: list[Element] | None = None) -> Element:
    """An Adaptive Card of `body` (and `buttons`), in the version `Action.Execute` needs."""
    out: Element = {
        "type": "AdaptiveCard",
        "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
        "version": CARD_VERSION,
        "body": body,
        "msteams": {"width": "Full"},
    }
    if buttons:
        out["actions"] = buttons
    return out


def refusal(note: str) -> Element:
    """The card a refused click is answered with: the line saying why, and nothing of the
    request (no tool, arguments, prompt, queue or buttons)."""
    return card([literal(note, color="Attention", weight="Bolder")])


def render(request: Request, config: Config, channel: str, note: str | None = None) -> Element:
    """The card for `request` as it stands, as shown in Teams channel `channel` (`teams:NAME`);
    `note` is a line for the one who clicked (why a click was refused)."""
    body = describe(request, config)
    buttons: list[Element] = []
    queue = config.queues.get(request.queue)
    if not request.is_pending:
        body += outcome(request, config)
    elif queue is not None and channel in queue.channels:
        body += progress(request, config)
        inputs, buttons = actions(request, config)
        body += inputs
    else:
        body += moved(request, config)
    if note:
        body.append(literal(note, color="Attention", weight="Bolder"))
    body.append(
        literal(f"request {request.id} · queue {request.queue}", isSubtle=True, size="Small")
    )
    return card(body, buttons)


def summary(request: Request) -> str:
    """The activity's text: what a notification or a screen reader gets."""
    status = "waiting" if request.is_pending else request.status.value.replace("_", " ")
    return clip(
        f"{TITLES.get(request.kind, 'Request')}: {one_line(request.tool_name)} ({status})", 200
    )
