"""Block Kit for one request: what the tool wants to do, who may decide, and the buttons.

Pure functions of the request and config, so the same request always renders the same way,
whichever notifier renders it. Ids of buttons and inputs come from `channels.slack.action_ids`.

Every text a requester could have written (prompt, tool name, arguments, reasons, role names,
questions and options) goes through `escape` wherever Slack reads mrkdwn, fallback text
included, so it can't mention `<!channel>` or disguise a link as `<https://evil|bank.com>`;
`escape` and the plain_text fields also drop control and bidi characters as email does
(`broker.domain.printable`), so `wire\u202emoney` can't read as another word; in the arguments they
are shown as `\\uXXXX`.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from broker.domain.config import Config
from broker.domain.models import HistoryEntry, Request, Status
from broker.domain.printable import lines, one_line, shown
from broker.domain.questions import answer_text, has_form, is_structured, questions_of
from channels import wording
from channels.slack import action_ids as ids
from channels.slack import always_modal as always
from channels.slack.question_modal import ANSWER_FORM
from channels.wording import clip, risk, title

Block = dict[str, Any]

MAX_SECTION = 2900
MAX_OPTIONS = 20
_OUTCOME_LINE = {
    Status.approved: ":white_check_mark: *Approved*",
    Status.modified: ":pencil2: *Approved with changed arguments*",
    Status.rejected: ":no_entry: *Rejected*",
    Status.answered: ":speech_balloon: *Answered*",
    Status.timed_out: ":hourglass: *Timed out*",
}


def escape(text: str) -> str:
    """Slack mrkdwn treats &, < and > as control characters: these three, and only these, are
    escaped (Slack's "Escaping text" rules); control and bidi characters are dropped first."""
    return lines(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_date(when: datetime) -> str:
    """A date every reader sees in their own time zone, with a UTC fallback."""
    fallback = when.strftime("%Y-%m-%d %H:%M UTC")
    return f"<!date^{int(when.timestamp())}^{{date_short_pretty}} at {{time}}|{fallback}>"


def who(config: Config, name: str | None) -> str:
    """An approver as a Slack mention when the config knows their Slack id."""
    if not name:
        return "someone"
    approver = config.approvers.get(name)
    user = approver.identity("slack_user_id") if approver else None
    if user:
        return f"<@{user}>"
    return f"`{escape(name)}`"


def deciders(config: Config, request: Request) -> str:
    """Roles as code, and the people holding them as mentions (those Slack knows)."""

    def mention(name: str) -> str | None:
        return who(config, name) if config.approvers[name].identity("slack_user_id") else None

    return wording.deciders(config, request, role=lambda r: f"`{escape(r)}`", person=mention)


def options_of(request: Request) -> list[str]:
    """Answer buttons for a question: `metadata.options`, when short enough to be buttons."""
    raw = request.metadata.get("options")
    if not isinstance(raw, list):
        return []
    opts = [str(o) for o in raw if isinstance(o, str | int | float) and not isinstance(o, bool)]
    if not opts or len(opts) > MAX_OPTIONS or any(len(o) > 200 for o in opts):
        return []
    return opts


def _section(text: str) -> Block:
    return {"type": "section", "text": {"type": "mrkdwn", "text": clip(text, MAX_SECTION)}}


def _button(text: str, action_id: str, request_id: str, style: str | None = None) -> Block:
    button: Block = {
        "type": "button",
        "text": {"type": "plain_text", "text": clip(one_line(text), 75)},
        "action_id": action_id,
        "value": request_id,
    }
    if style:
        button["style"] = style
    return button


def _last_escalation(request: Request) -> HistoryEntry | None:
    moves = [h for h in request.history if h.event == "escalated"]
    return moves[-1] if moves else None


def describe(request: Request, config: Config) -> list[Block]:
    """The part that never changes: the prompt, the tool call and its context."""
    fields = [
        f"*Tool*\n`{escape(one_line(request.tool_name))}`",
        f"*Run*\n{'`' + escape(one_line(request.run_id)) + '`' if request.run_id else '(none)'}",
        f"*Who may decide*\n{deciders(config, request)}",
        f"*Expires*\n{slack_date(request.expires_at)}",
    ]
    args = shown(json.dumps(request.args, indent=2, ensure_ascii=False))
    label = risk(request)
    marked = [_section(f":warning: *Risk:* {escape(label)}")] if label else []
    return [
        {
            "type": "header",
            "text": {"type": "plain_text", "text": clip(title(request), 150)},
        },
        *marked,
        _section(escape(request.prompt or request.tool_name)),
        {"type": "section", "fields": [{"type": "mrkdwn", "text": f} for f in fields]},
        _section(f"*Arguments*\n```{clip(escape(args), MAX_SECTION - 20)}```"),
    ]


def question_summary(request: Request) -> list[Block]:
    """What a structured question asks, so people see it before opening the form."""
    questions = questions_of(request.metadata)
    if questions is None:
        return []
    lines = []
    for q in questions:
        lines.append(f"*{escape(q.header)}*  {escape(q.question)}")
        for option in q.options:
            line = f"•  {escape(option.label)}"
            if option.description:
                line += f" _{escape(option.description)}_"
            lines.append(line)
    return [_section("\n".join(lines))]


def action_blocks(request: Request, config: Config) -> list[Block]:
    """Buttons (and a text input for open questions) for a request people can still decide.

    A structured question (`metadata.questions` or `answer_schema`) gets one "Answer…" button
    instead, which opens the form (`channels.slack.question_modal.answer_modal`).
    """
    rid = request.id
    buttons: list[Block] = []
    blocks: list[Block] = []
    if request.kind == "approval":
        buttons.append(_button("Approve", ids.APPROVE, rid, "primary"))
        if request.run_id and request.suggested_rules:  # a rule for this run or agent
            buttons.append(_button("Always…", always.ALWAYS, rid))
    elif has_form(request.metadata):
        blocks += question_summary(request)
        buttons.append(_button("Answer…", ANSWER_FORM, rid, "primary"))
    else:
        options = options_of(request)
        for option in options:
            buttons.append(_button(option, ids.option_action_id(option), rid))
        if not options:
            blocks.append(
                {
                    "type": "input",
                    "block_id": ids.ANSWER_BLOCK,
                    "optional": False,
                    "label": {"type": "plain_text", "text": "Your answer"},
                    "element": {"type": "plain_text_input", "action_id": ids.ANSWER_TEXT},
                }
            )
            buttons.append(_button("Answer", ids.ANSWER, rid, "primary"))
    buttons.append(_button("Reject", ids.REJECT, rid, "danger"))
    if config.escalation_target(request.queue):
        buttons.append(_button("Escalate", ids.ESCALATE, rid))
    blocks.append({"type": "actions", "block_id": ids.actions_block_id(rid), "elements": buttons})
    return blocks


def votes_line(request: Request, config: Config) -> str | None:
    """ "1 of 2 approvals: alice" for a request that needs several; None when it needs one.

    Votes for other args (a `modified` approval) are counted apart: they don't add up.
    """
    if request.quorum <= 1:
        return None
    groups: dict[str, list[str]] = {}
    for vote in request.approvals:
        groups.setdefault(vote.args_hash, []).append(who(config, vote.by))
    if not groups:
        return f":busts_in_silhouette: 0 of {request.quorum} approvals"
    parts = []
    for hash_, names in groups.items():
        other = "" if hash_ == request.args_hash else " (of changed arguments)"
        parts.append(f"{len(names)} of {request.quorum} approvals{other}: {', '.join(names)}")
    return ":busts_in_silhouette: " + "\n".join(parts)


def votes_blocks(request: Request, config: Config) -> list[Block]:
    """Votes so far and who is on it, for a request still pending."""
    lines = [votes_line(request, config)]
    if request.acked_by and request.acked_until:
        lines.append(
            f":eyes: {who(config, request.acked_by)} is on it"
            f" (escalation paused until {slack_date(request.acked_until)})"
        )
    shown = [line for line in lines if line]
    return [_section("\n".join(shown))] if shown else []


def ack_block(request: Request, config: Config) -> Block:
    """ "I'm on it" (a section's button, apart from the deciding ones): holds escalation."""
    minutes = max(1, round(config.ack_timeout_for(request.queue) / 60))
    block = _section(f"_Working on it? Say so, and escalation waits {minutes} min._")
    block["accessory"] = _button("I'm on it", ids.ACK, request.id)
    return block


def outcome_blocks(request: Request, config: Config) -> list[Block]:
    """Who decided what and when, for a request that is no longer pending."""
    decision = request.decision
    line = _OUTCOME_LINE.get(request.status, f"*{request.status.value}*")
    if decision is not None:
        by = "the sweeper" if decision.decided_by == "sweeper" else who(config, decision.decided_by)
        if request.status is not Status.timed_out:
            line += f" by {by}"
        if decision.decided_at:
            line += f" {slack_date(decision.decided_at)}"
        if decision.reason:
            line += f"\n>{escape(decision.reason)}"
        if decision.args is not None:
            changed = shown(json.dumps(decision.args, ensure_ascii=False))
            line += f"\n*New arguments* `{escape(clip(changed, 1500))}`"
        if decision.answer is not None and is_structured(request.metadata):
            read = answer_text(request.metadata, decision.answer)
            quoted = "\n".join(f">{escape(row)}" for row in clip(read, 1500).splitlines())
            line += f"\n*Answer*\n{quoted}"
        elif decision.answer is not None:
            answer = json.dumps(decision.answer, ensure_ascii=False)
            line += f"\n*Answer* `{escape(clip(answer, 1500))}`"
    return [_section(line)]


def moved_blocks(request: Request, config: Config) -> list[Block]:
    """For a channel the request has left: where it went, who moved it, when and why."""
    move = _last_escalation(request)
    line = f":arrow_upper_right: *Escalated to `{escape(request.queue)}`*"
    if move is not None:
        line += f" by {'the sweeper' if move.by == 'sweeper' else who(config, move.by)}"
        line += f" {slack_date(move.at)}"
        if move.reason:
            line += f"\n>{escape(move.reason)}"
    return [_section(line)]


def channel_serves(config: Config, channel: str, queue: str) -> bool:
    q = config.queues.get(queue)
    return bool(q and channel in q.channels)


def render(request: Request, config: Config, channel: str) -> tuple[str, list[Block]]:
    """(fallback text, blocks) for `request` as it stands, as shown in Slack channel `channel`.

    The fallback text is mrkdwn too (it is what notifications show), so requester text in it
    is escaped like everywhere else: a prompt saying `<!channel>` must not page a channel.
    """
    blocks = describe(request, config)
    tool = escape(one_line(request.tool_name))
    if not request.is_pending:
        if not channel_serves(config, channel, request.queue):  # a copy left behind
            blocks += moved_blocks(request, config)
        blocks += outcome_blocks(request, config)
        status = request.status.value.replace("_", " ")
        text = f"{tool}: {status}"
    elif channel_serves(config, channel, request.queue):
        blocks += votes_blocks(request, config)
        blocks += action_blocks(request, config)
        blocks.append(ack_block(request, config))
        text = f"{title(request)}: {escape(clip(request.prompt, 200))}"
    else:
        blocks += moved_blocks(request, config)
        text = f"{tool}: escalated to {escape(request.queue)}"
    blocks.append(
        {
            "type": "context",
            "elements": [
                {
                    "type": "mrkdwn",
                    "text": f"request `{escape(request.id)}` · queue `{escape(request.queue)}`",
                }
            ],
        }
    )
    return text, blocks


def fingerprint(request: Request) -> tuple[str, str, str, str]:
    """What a rendered message depends on that can change after it is posted."""
    decided = request.decision.model_dump_json() if request.decision else ""
    votes = ",".join(f"{v.by}={v.args_hash}" for v in request.approvals)
    return request.status.value, request.queue, decided, f"{votes};{request.acked_until}"
