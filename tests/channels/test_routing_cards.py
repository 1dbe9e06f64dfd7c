"""A routed request's risk label on every channel's card, as each channel renders it: the Slack
blocks, the Teams Adaptive Card, the Telegram and Discord cards, the mail (text and HTML), the
inbox (its data: `risk` on the wire); a request without one shows none."""

from __future__ import annotations

import json

from redis import Redis

from broker.domain.config import parse_config
from broker.domain.models import NewRequest
from broker.domain.rules.models import parse_body
from broker.facade import Broker
from channels.cards.render import render as card
from channels.email.render import render_mail
from channels.slack.blocks import render as slack
from channels.teams.adaptive_cards import render as teams

RISK = "high: refund over 500"
CONFIG = {"queues": {"default": {"channels": ["inbox"]}, "finance": {"channels": ["inbox"]}}}


def test_every_card_shows_the_risk_a_route_set_and_none_without(redis: Redis) -> None:
    broker = Broker(redis, parse_config(CONFIG), prefix="t:")
    broker.requests.rules.create(
        parse_body({"effect": "route", "tool": "refund", "args": {"amount": {"gt": 500}},
                    "route": {"queue": "finance", "risk": RISK}}),
        created_by="pat",
    )  # fmt: skip
    [routed, plain] = [
        broker.create_request(NewRequest(tool_name="refund", args={"amount": a})) for a in (900, 10)
    ]
    config = broker.config
    shown = {
        "slack": lambda r: json.dumps(slack(r, config, "slack:x")[1]),
        "teams": lambda r: json.dumps(teams(r, config, "teams:x")),
        "telegram": lambda r: card(r, config, "telegram:x").text,
        "discord": lambda r: card(r, config, "discord:x").text,
        "mail text": lambda r: render_mail(r, config, "a@example.com", [], r.expires_at)[1],
        "mail html": lambda r: render_mail(r, config, "a@example.com", [], r.expires_at)[2],
        "inbox": lambda r: broker.get_request(r.id).model_dump_json(),
    }
    for channel, text_of in shown.items():
        assert RISK in text_of(routed), channel
        assert "Risk" not in text_of(plain) and 'risk": "' not in text_of(plain), channel
    assert json.loads(shown["inbox"](plain))["risk"] is None
