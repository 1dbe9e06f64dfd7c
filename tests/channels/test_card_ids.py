"""Button tokens of chat cards fit Telegram's 64 bytes of callback_data for every request id
the broker makes, and read back as written; anything else is no token."""

from __future__ import annotations

import pytest
from redis import Redis

from broker.domain.config import parse_config
from broker.domain.ids import new_id, round_request_id
from broker.facade import Broker
from channels.cards import button_tokens as ids
from channels.copies import keeps_copies
from notifiers.runner import build_channels
from tests.support.fakes.harness import options, webhook


@pytest.mark.parametrize(
    "request_id",
    [new_id("req"), round_request_id(new_id("run"), 10, 99), round_request_id(new_id("run"), 1, 0)],
    ids=["request", "round-10-call-99", "round-1-call-0"],  # the same names in every xdist worker
)
def test_every_token_of_a_broker_made_id_fits_64_bytes_and_reads_back(request_id: str) -> None:
    for verb, index in [(ids.APPROVE, None), (ids.OPTION, 9), (ids.ALWAYS_RULE, 4)]:
        token = ids.token(verb, request_id, index)
        assert len(token.encode()) <= ids.MAX_TOKEN_BYTES
        assert ids.parse(token) == (verb, index, request_id)


@pytest.mark.parametrize("text", ["", "a", "a:", ":req_1", "ab:req_1", "a:req 1", "a:" + "x" * 70])
def test_anything_else_is_no_token(text: str) -> None:
    assert ids.parse(text) is None


def test_an_id_too_long_for_a_button_is_refused_rather_than_cut() -> None:
    with pytest.raises(ValueError, match="does not fit"):
        ids.token(ids.APPROVE, "r" * 63)


def test_the_channels_that_post_copies_are_copy_updaters_and_the_others_are_not(
    redis: Redis,
) -> None:
    raw = {
        "queues": {
            "default": {"channels": ["inbox", "webhook:ops", "slack:a", "telegram:a", "discord:a"]}
        },
        "webhooks": {"ops": webhook("http://127.0.0.1:9/ops")},
        "slack": {"bot_token": "x", "signing_secret": "s", "channels": {"a": {"channel": "C1"}}},
        "telegram": {
            "bot_token": "1:x",
            "webhook_secret": "s" * 16,
            "chats": {"a": {"chat_id": 1}},
        },
        "discord": {
            "application_id": "1",
            "public_key": "ab" * 32,
            "bot_token": "x",
            "channels": {"a": {"channel_id": "2"}},
        },
    }
    broker = Broker(redis, parse_config(raw), prefix="t:")
    channels = build_channels(broker, broker.config, options(), "test")
    try:
        assert sorted(n for n, c in channels.items() if keeps_copies(c)) == [
            "discord:a",
            "slack:a",
            "telegram:a",
        ]
    finally:
        for channel in channels.values():
            channel.close()
