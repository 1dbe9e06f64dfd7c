"""Slack shows requester text without control or bidi characters, as email does.

`wire\\u202emoney` in a prompt, tool name, question, option or reason would read as another
word in Slack; a C0 or C1 control could hide or forge text. Every block, the fallback text,
the answer and reject modals and the ephemeral notices drop them (the one helper email uses,
`broker.domain.printable`); the arguments show them as `\\uXXXX`, so what was sent stays visible.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from broker.domain.args_hash import args_hash
from broker.domain.config import parse_config
from broker.domain.models import Decision, Request
from broker.domain.printable import BIDI_CONTROLS, CONTROLS
from channels.email.render import Link, render_mail
from channels.slack.action_ids import reject_modal
from channels.slack.blocks import render
from channels.slack.question_modal import answer_modal
from channels.slack.replies import notice

pytestmark = pytest.mark.unit  # no Redis, no server: tests/conftest.py runs these last

NOW = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
TRICKS = "\u202egnp.exe\u202c\u2066x\u2069\u200e\u200f\u061c\x00\x07\x1b[31m\x85\x9b"
CONFIG = parse_config(
    {
        "queues": {"default": {"channels": ["slack:approvals"]}},
        "slack": {
            "bot_token": "x",
            "signing_secret": "y",
            "channels": {"approvals": {"channel": "C1"}},
        },
    }
)


def request(**fields: Any) -> Request:
    args = {"to": f"wire{TRICKS}money"}
    base: dict[str, Any] = {
        "id": "req_1",
        "tool_call_id": "call_1",
        "tool_name": f"wire{TRICKS}",
        "args": args,
        "args_hash": args_hash(args),
        "prompt": f"Send it{TRICKS}\nsecond line",
        "created_at": NOW,
        "expires_at": NOW + timedelta(minutes=10),
    }
    return Request.model_validate(base | fields)


IDS = {"action_id", "block_id", "value", "callback_id", "private_metadata"}


def texts(node: Any) -> list[str]:
    """Every string in a Slack payload that people read (ids and values aren't shown)."""
    if isinstance(node, dict):
        return [t for k, v in node.items() if k not in IDS for t in texts(v)]
    if isinstance(node, list):
        return [t for v in node for t in texts(v)]
    return [node] if isinstance(node, str) else []


def unsafe(text: str) -> list[str]:
    return [f"U+{ord(c):04X}" for c in text if (ord(c) in BIDI_CONTROLS | CONTROLS) and c != "\n"]


def assert_clean(payload: Any) -> None:
    for text in texts(payload):
        assert not unsafe(text), (unsafe(text), text)


QUESTIONS = [
    {
        "question": f"Which{TRICKS} account?",
        "header": "Acct\u202e",
        "context": f"ctx{TRICKS}",
        "options": [
            {"label": f"main{TRICKS}", "description": f"d{TRICKS}", "preview": f"p{TRICKS}"},
            {"label": "other"},
        ],
    }
]


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"kind": "question", "metadata": {"questions": QUESTIONS}},
        {"kind": "question", "metadata": {"options": [f"yes{TRICKS}", "no"]}},
        {
            "status": "rejected",
            "decision": Decision(outcome="rejected", reason=f"no{TRICKS}", decided_by="bob"),
        },
        {
            "status": "modified",
            "decision": Decision(outcome="modified", args={"to": f"x{TRICKS}"}, decided_by="bob"),
        },
        {"queue": "elsewhere"},
    ],
)
def test_blocks_and_fallback_text_carry_no_control_or_bidi_characters(
    fields: dict[str, Any],
) -> None:
    text, blocks = render(request(**fields), CONFIG, "slack:approvals")
    assert_clean(text)
    assert_clean(blocks)


def test_the_arguments_show_what_was_sent_written_out() -> None:
    _, blocks = render(request(), CONFIG, "slack:approvals")
    shown = json.dumps(blocks)
    assert "wire\\\\u202egnp.exe\\\\u202c" in shown  # \u202e written out, not applied
    assert "\\\\u0085" in shown and "\\\\u009b" in shown


def test_the_prompt_keeps_its_line_breaks_and_visible_text() -> None:
    text, blocks = render(request(), CONFIG, "slack:approvals")
    prompt = blocks[1]["text"]["text"]
    assert prompt.startswith("Send itgnp.exex") and prompt.endswith("[31m  \nsecond line")
    assert text.endswith("Send itgnp.exex   [31m  \nsecond line")


def test_modals_and_notices_carry_no_control_or_bidi_characters() -> None:
    question = request(kind="question", metadata={"questions": QUESTIONS})
    assert_clean(answer_modal(question))
    schema = {
        "type": "object",
        "description": f"fill{TRICKS}",
        "properties": {"a": {"type": "string", "title": f"T{TRICKS}", "description": f"D{TRICKS}"}},
    }
    assert_clean(answer_modal(request(kind="question", metadata={"answer_schema": schema})))
    assert_clean(reject_modal("req_1", f"wire{TRICKS}"))
    assert_clean(notice(f"answer.a: 'x{TRICKS}' is not valid"))


def test_email_and_slack_clean_a_name_the_same_way() -> None:
    """One helper: the tool name reads the same in a mail and in Slack."""
    r = request()
    _, text, _ = render_mail(r, CONFIG, "a@example.com", [Link("approve", "https://x/1")], NOW)
    _, blocks = render(r, CONFIG, "slack:approvals")
    assert "wiregnp.exex [31m" in text
    assert "`wiregnp.exex [31m`" in json.dumps(blocks)
