"""`approval-broker channels test KIND:NAME` posts a sample card through the channel's real
sender, to the local fakes that check what each platform checks: Slack, Teams, Telegram,
Discord, a mail through aiosmtpd, a Standard Webhooks event a receiver verifies. It prints
where it went, or the one-line error; the made-up request reaches no broker that runs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from approval_broker.cli import app
from approval_broker.cli_channels import TEST_PROMPT, TEST_TOOL
from tests.support.chat_setup import (
    DC_CHANNEL,
    TG_CHAT,
    discord_section,
    fake_discord,  # noqa: F401 - the fixture
    fake_telegram,  # noqa: F401 - the fixture
    telegram_section,
)
from tests.support.fakes.discord import FakeDiscord
from tests.support.fakes.harness import SECRET, webhook
from tests.support.fakes.slack import FakeSlack
from tests.support.fakes.smtp import SmtpSink
from tests.support.fakes.teams import FakeConnector
from tests.support.fakes.telegram import FakeTelegram
from tests.support.fakes.webhook_receiver import WebhookReceiver
from tests.support.notifier_setup import email_section, slack_section
from tests.support.teams_setup import CONVERSATION, TENANT

runner = CliRunner()


def toml(table: dict[str, Any], prefix: str = "") -> str:
    """A config's tables as TOML (values as JSON, which TOML reads for these)."""
    lines, tables = [], []
    for key, value in table.items():
        if isinstance(value, dict):
            tables.append((key, value))
        else:
            lines.append(f"{key} = {json.dumps(value)}")
    out = (f"[{prefix}]\n" if prefix and lines else "") + "".join(f"{ln}\n" for ln in lines)
    for key, value in tables:
        out += toml(value, f"{prefix}.{key}" if prefix else key)
    return out


@pytest.fixture
def configure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Write a config (queue `default` lists `channel`) and name it in the environment."""

    def write(channel: str, **sections: Any) -> Path:
        path = tmp_path / "approval-broker.toml"
        path.write_text(toml({"queues": {"default": {"channels": [channel]}}, **sections}))
        monkeypatch.setenv("APPROVAL_BROKER_CONFIG", str(path))
        monkeypatch.delenv("APPROVAL_BROKER_REDIS_URL", raising=False)
        return path

    return write


@pytest.fixture
def slack() -> Iterator[FakeSlack]:
    fake = FakeSlack().start()
    yield fake
    fake.stop()


@pytest.fixture
def smtp() -> Iterator[SmtpSink]:
    sink = SmtpSink().start()
    yield sink
    sink.stop()


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    server = WebhookReceiver(SECRET).start()
    yield server
    server.stop()


@pytest.fixture
def connector() -> Iterator[FakeConnector]:
    fake = FakeConnector((CONVERSATION,)).start()
    yield fake
    fake.stop()


def channels_test(channel: str):
    out = runner.invoke(app, ["channels", "test", channel])
    print(out.output)  # what the docs show (`-s`)
    return out


def test_slack_gets_a_sample_card_marked_as_a_test(configure, slack: FakeSlack) -> None:
    configure("slack:approvals", slack=slack_section(slack))
    out = channels_test("slack:approvals")
    assert out.exit_code == 0, out.output
    assert out.stdout.startswith(
        "sent a test message to slack:approvals (posts into Slack channel C1): posted "
    )
    [post] = slack.calls_to("chat.postMessage", ok_only=True)
    assert post.params["channel"] == "C1"
    assert TEST_TOOL in json.dumps(post.params)
    assert "Test message from `approval-broker channels test`" in json.dumps(post.params)


def test_a_slack_refusal_is_one_line(configure, slack: FakeSlack) -> None:
    configure("slack:approvals", slack=slack_section(slack))
    slack.fail("chat.postMessage", 200, error="channel_not_found")
    out = channels_test("slack:approvals")
    assert out.exit_code == 1
    [line] = out.stderr.splitlines()
    assert line.startswith("error: slack:approvals: ") and "channel_not_found" in line, line


def test_telegram_gets_a_sample_card(configure, telegram: FakeTelegram) -> None:
    configure("telegram:ops", telegram=telegram_section(telegram))
    out = channels_test("telegram:ops")
    assert out.exit_code == 0, out.output
    assert out.stdout.startswith(
        f"sent a test message to telegram:ops (posts into chat {TG_CHAT}): posted "
    )
    [sent] = telegram.calls_to("sendMessage", ok_only=True)
    assert sent.params["chat_id"] == TG_CHAT
    assert TEST_TOOL in json.dumps(sent.params)


def test_discord_gets_a_sample_card(configure, discord: FakeDiscord) -> None:
    configure("discord:ops", discord=discord_section(discord))
    out = channels_test("discord:ops")
    assert out.exit_code == 0, out.output
    assert out.stdout.startswith(
        f"sent a test message to discord:ops (posts into channel {DC_CHANNEL}): posted "
    )
    [sent] = discord.calls_to("create", ok_only=True)
    assert sent.channel == DC_CHANNEL
    assert "Test message from" in sent.params["content"]


def test_teams_gets_a_sample_card(configure, connector: FakeConnector) -> None:
    teams = {
        "allow_anonymous": True,
        "channels": {
            "approvals": {
                "service_url": connector.url,
                "conversation_id": CONVERSATION,
                "tenant_id": TENANT,
            }
        },
    }
    configure("teams:approvals", teams=teams)
    out = channels_test("teams:approvals")
    assert out.exit_code == 0, out.output
    assert out.stdout.startswith(
        f"sent a test message to teams:approvals (posts into conversation {CONVERSATION}): posted "
    )
    [(_, card)] = [(aid, body) for (_, aid), body in connector.activities.items()]
    assert "Test message from" in json.dumps(card) and TEST_TOOL in json.dumps(card)


def test_an_email_list_gets_a_sample_mail(configure, smtp: SmtpSink) -> None:
    configure("email:leads", email=email_section(smtp))
    out = channels_test("email:leads")
    assert out.exit_code == 0, out.output
    assert out.stdout.startswith(
        "sent a test message to email:leads (mails lead@example.com, cfo@example.com): mailed 2 recipient(s)\n"
    )
    [mail] = smtp.to("lead@example.com")
    assert TEST_TOOL in mail.part("plain")


def test_a_webhook_gets_a_signed_test_event(configure, receiver: WebhookReceiver) -> None:
    configure("webhook:ops", webhooks={"ops": webhook(receiver.url())})
    out = channels_test("webhook:ops")
    assert out.exit_code == 0, out.output
    assert out.stdout.startswith(
        f"sent a test message to webhook:ops (posts to {receiver.url()}): answered HTTP 204 (msg_"
    )
    [delivery] = receiver.to("/hook")
    assert delivery.verified  # signed with the endpoint's secret (Standard Webhooks)
    event = delivery.payload
    assert event["type"] == "approval.requested"
    assert event["data"]["tool_name"] == TEST_TOOL and event["data"]["prompt"] == TEST_PROMPT


def test_an_undefined_channel_names_the_file(configure, slack: FakeSlack) -> None:
    path = configure("slack:approvals", slack=slack_section(slack))
    out = channels_test("slack:nope")
    assert out.exit_code == 1
    assert out.stderr == (
        f"error: config {path}: slack channel 'nope' is not defined under [slack.channels.nope]\n"
    )
    assert slack.calls_to("chat.postMessage") == []


def test_the_inbox_has_nothing_to_send(configure) -> None:
    configure("inbox")
    out = channels_test("inbox")
    assert out.exit_code == 1
    assert out.stderr == "error: inbox: nothing to send (requests show in the web inbox, at /)\n"
