"""What a requester writes can't act in Slack or in mail, and SMTP credentials need TLS."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from redis import Redis
from typer.testing import CliRunner

from approval_broker.cli import app
from broker.domain.args_hash import args_hash
from broker.domain.config import parse_config
from broker.domain.errors import ConfigError
from broker.domain.models import Decision, HistoryEntry, NewRequest, Outcome, Request, Status
from broker.facade import Broker
from channels.email.config import EmailConfig
from channels.email.render import BIDI_CONTROLS, Link, render_mail
from channels.email.sender import smtp_target
from channels.slack.blocks import render
from notifiers.runner import start_notifier
from tests.support.fakes.harness import options
from tests.support.fakes.slack import FakeSlack
from tests.support.waiting import wait_for

NOW = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
MENTION = "<!channel>"
DISGUISED = "<https://evil.example|bank.com>"
HOSTILE = f"{MENTION} pay here {DISGUISED} & thanks"

CONFIG = parse_config(
    {
        "queues": {
            "default": {"channels": ["slack:approvals"], "escalate_to": "managers"},
            "managers": {"channels": ["slack:managers"]},
        },
        "slack": {
            "bot_token": "x",
            "signing_secret": "y",
            "channels": {"approvals": {"channel": "C1"}, "managers": {"channel": "C2"}},
        },
    }
)


def make_request(**fields: object) -> Request:
    args = {"to": HOSTILE}
    base: dict[str, object] = {
        "id": "req_1",
        "tool_call_id": "call_1",
        "tool_name": f"pay{MENTION}",
        "args": args,
        "args_hash": args_hash(args),
        "prompt": HOSTILE,
        "created_at": NOW,
        "expires_at": NOW + timedelta(minutes=10),
    }
    return Request.model_validate(base | fields)


def mrkdwn_texts(blocks: list[dict[str, Any]]) -> list[str]:
    """Every text Slack reads as mrkdwn, wherever it sits in the blocks."""
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") == "mrkdwn":
                found.append(node["text"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(blocks)
    return found


def assert_inert(text: str) -> None:
    """No mention, link or other markup but our own dates and mentions of configured people."""
    assert "<" not in text.replace("<!date^", "").replace("<@", ""), text


# ---- Slack ------------------------------------------------------------------------------


@pytest.mark.parametrize("state", ["pending", "decided", "moved"])
def test_requester_text_is_escaped_in_slack_fallback_text_and_sections(state: str) -> None:
    request, channel = make_request(), "slack:approvals"
    if state == "decided":
        decision = Decision(
            outcome=Outcome.rejected, reason=HOSTILE, decided_by=MENTION, decided_at=NOW
        )
        request = make_request(status=Status.rejected, decision=decision)
    elif state == "moved":
        move = HistoryEntry(at=NOW, event="escalated", by=MENTION, reason=HOSTILE)
        request = make_request(queue="managers", history=[move])
    text, blocks = render(request, CONFIG, channel)
    assert_inert(text)
    assert "&lt;!channel&gt;" in text  # shown, not acted on
    texts = mrkdwn_texts(blocks)
    for shown in texts:
        assert_inert(shown)
    assert any("&lt;https://evil.example|bank.com&gt; &amp; thanks" in t for t in texts)


def test_plain_text_fields_show_requester_text_as_written() -> None:
    request = make_request(kind="question", metadata={"options": ["<b>yes</b>", "no & maybe"]})
    _, blocks = render(request, CONFIG, "slack:approvals")
    (actions,) = [b for b in blocks if b["type"] == "actions"]
    labels = [e["text"]["text"] for e in actions["elements"]]
    assert labels[:2] == ["<b>yes</b>", "no & maybe"]  # plain_text: Slack shows it literally


def test_the_posted_fallback_text_is_escaped(redis: Redis) -> None:
    slack = FakeSlack().start()
    try:
        broker = Broker(
            redis,
            parse_config(
                {
                    "queues": {"default": {"channels": ["slack:approvals"]}},
                    "slack": {
                        "bot_token": slack.token,
                        "signing_secret": "s",
                        "api_base_url": slack.url,
                        "channels": {"approvals": {"channel": "C1"}},
                    },
                }
            ),
            prefix="t:",
        )
        notifier = start_notifier(broker, options())
        try:
            request = broker.create_request(NewRequest(tool_name="pay", prompt=HOSTILE))
            (post,) = wait_for(lambda: slack.posts_for(request.id))
        finally:
            notifier.stop()
    finally:
        slack.stop()
    assert_inert(post["text"])
    assert "&lt;!channel&gt;" in post["text"]


# ---- mail -------------------------------------------------------------------------------

TRICKS = "\u202egnp.exe\u202c\u2066x\u2069\u200e\u200f\x00\x07\x1b[31m"


def test_control_and_bidi_characters_never_reach_a_mail_subject_or_the_names_shown() -> None:
    request = make_request(
        prompt=f"Pay{TRICKS}\r\nBcc: all@example.com\nsecond line",
        tool_name=f"pa{TRICKS}y",
        run_id=f"run{TRICKS}",
        allowed_roles=[f"fin{TRICKS}ance"],
        args={"amount": "100\u202e0001"},
    )
    links = [Link("approve", "https://x/1")]
    subject, text, html = render_mail(request, CONFIG, "a@example.com", links, NOW)

    def clean(value: str, keep: str = "") -> bool:
        return not any(
            ord(c) in BIDI_CONTROLS or ((ord(c) < 0x20 or ord(c) == 0x7F) and c not in keep)
            for c in value
        )

    assert clean(subject)
    assert subject.startswith("[Approval needed] Pay") and "Bcc: all@example.com" in subject
    for body in (text, html):
        assert clean(body, keep="\n")
        assert "pagnp.exex [31my" in body  # the tool name, as one visible line
        assert "fingnp.exex [31mance" in body  # a role name
        assert "rungnp.exex [31m" in body
    assert "Bcc: all@example.com\nsecond line" in text  # the prompt keeps its line breaks
    assert '"100\\u202e0001"' in text  # an argument's bidi control is shown, not obeyed


# ---- SMTP credentials need TLS ------------------------------------------------------------


def email(**fields: Any) -> EmailConfig:
    return EmailConfig.model_validate({"smtp_url": "smtp://mail.example.com"} | fields)


@pytest.mark.parametrize(
    "fields",
    [
        {"username": "bot", "password": "pw"},
        {"smtp_url": "smtp://bot:pw@mail.example.com:587"},
    ],
    ids=["username-key", "in-the-url"],
)
def test_smtp_credentials_without_tls_are_refused(fields: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="allow_plaintext_auth = true in \\[email\\]"):
        smtp_target(email(**fields))


@pytest.mark.parametrize(
    "fields",
    [
        {"username": "bot", "smtp_url": "smtps://mail.example.com"},
        {"username": "bot", "starttls": True},
        {"username": "bot", "allow_plaintext_auth": True},
        {},
    ],
    ids=["smtps", "starttls", "allowed", "no-credentials"],
)
def test_smtp_credentials_go_over_tls_or_with_explicit_consent(fields: dict[str, Any]) -> None:
    assert smtp_target(email(**fields)).host == "mail.example.com"


@pytest.fixture
def plaintext_config(tmp_config: Callable[[str], Path]) -> Iterator[Path]:
    yield tmp_config(
        """
[queues.default]
channels = ["email:leads"]

[email]
smtp_url = "smtp://127.0.0.1:2525"
username = "bot"
password = "s3cret"
[email.lists.leads]
to = ["lead@example.com"]
"""
    )


def test_a_notifier_with_plaintext_smtp_credentials_does_not_start(redis: Redis) -> None:
    raw = {
        "queues": {"default": {"channels": ["email:leads"]}},
        "email": {
            "smtp_url": "smtp://127.0.0.1:2525",
            "username": "bot",
            "lists": {"leads": {"to": ["lead@example.com"]}},
        },
    }
    broker = Broker(redis, parse_config(raw), prefix="t:")
    with pytest.raises(ConfigError, match="allow_plaintext_auth"):
        start_notifier(broker, options())


def test_the_notifier_command_names_the_key_in_one_line(
    plaintext_config: Path, redis_url: str
) -> None:
    env = {
        "APPROVAL_BROKER_CONFIG": str(plaintext_config),
        "APPROVAL_BROKER_REDIS_URL": redis_url,
        "APPROVAL_BROKER_KEY_PREFIX": "t:",
    }
    result = CliRunner().invoke(app, ["notifier"], env=env)
    assert result.exit_code == 1
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert "allow_plaintext_auth = true in [email]" in lines[0]
    assert "Traceback" not in result.output and "s3cret" not in result.output
