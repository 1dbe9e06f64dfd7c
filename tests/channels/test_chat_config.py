"""The `[telegram]` and `[discord]` config: a channel naming a chat nothing defines, a weak
webhook secret, a public key that is not one, or two approvers sharing a platform user, stop
every role at start with a one-line error naming the key."""

from __future__ import annotations

from typing import Any

import pytest

from broker.domain.config import parse_config
from broker.domain.errors import ConfigError
from channels.discord.config import discord_section
from channels.telegram.config import telegram_section

pytestmark = pytest.mark.unit  # no Redis, no server: tests/conftest.py runs these last

TELEGRAM = {"bot_token": "1:x", "webhook_secret": "s" * 16, "chats": {"ops": {"chat_id": -100}}}
DISCORD = {
    "application_id": "1",
    "public_key": "ab" * 32,
    "bot_token": "x",
    "channels": {"ops": {"channel_id": "2"}},
}


def raw(channels: list[str], **extra: Any) -> dict[str, Any]:
    return {
        "queues": {"default": {"channels": channels}},
        "telegram": TELEGRAM,
        "discord": DISCORD,
        **extra,
    }


def test_telegram_and_discord_channels_that_exist_are_accepted() -> None:
    config = parse_config(raw(["telegram:ops", "discord:ops"]))
    assert (telegram := telegram_section(config)) is not None and telegram.chats[
        "ops"
    ].chat_id == -100
    assert (discord := discord_section(config)) is not None and discord.channels[
        "ops"
    ].channel_id == "2"


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (raw(["telegram:nope"]), "telegram chat 'nope' is not defined under [telegram.chats.nope]"),
        (raw(["discord:nope"]), "discord channel 'nope' is not defined"),
        (
            {**raw([]), "telegram": {**TELEGRAM, "webhook_secret": "short"}},
            "telegram.webhook_secret",
        ),
        ({**raw([]), "discord": {**DISCORD, "public_key": "not-hex"}}, "discord.public_key"),
        (
            raw(
                [],
                approvers={
                    "alice": {"telegram_user_id": 7},
                    "bob": {"telegram_user_id": 7},
                },
            ),
            "approvers.bob.telegram_user_id: approver 'alice' has the same telegram user id",
        ),
        (
            raw([], approvers={"alice": {"discord_user_id": "9"}, "bob": {"discord_user_id": "9"}}),
            "approvers.bob.discord_user_id",
        ),
    ],
    ids=["telegram-chat", "discord-channel", "weak-secret", "bad-key", "tg-twice", "dc-twice"],
)
def test_a_bad_chat_config_is_refused_naming_the_key(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(config)
    assert message in str(err.value)
