"""What a person's rule covers, by channel (`broker.domain.rules.matching`, fed by `in_queue`): only
queues that list the channel it was made through, as a deciding channel; a rule kept before
channels were recorded is judged by roles only; a policy rule covers every queue."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from broker.domain.config import Config, parse_config
from broker.domain.rules.matching import Call, in_queue, matches
from broker.domain.rules.models import Rule

NOW = datetime(2026, 1, 1, tzinfo=UTC)
SECRET = "whsec_" + "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="


@pytest.fixture
def cfg() -> Config:
    hook = {"url": "http://127.0.0.1:9/x", "secret": SECRET}
    return parse_config(
        {
            "queues": {
                "default": {"channels": ["inbox"]},
                "web": {"channels": ["webhook:ops"]},
                "audited": {"channels": ["webhook:audit"]},
            },
            "webhooks": {"ops": hook, "audit": {**hook, "decides": False}},
        }
    )


def rule(channel: str | None, roles: list[str] | None = ["finance"]) -> Rule:  # noqa: B006
    return Rule(
        id="r1",
        effect="allow",
        tool="refund",
        agent="a",
        created_by="alice",
        created_at=NOW,
        creator_roles=roles,
        creator_channel=channel,
    )


def covers(cfg: Config, made: Rule, queue: str) -> bool:
    return matches(made, in_queue(Call("refund", agent="a", queue=queue), cfg), NOW)


@pytest.mark.parametrize(
    ("channel", "roles", "queue", "covered"),
    [
        ("inbox", ["finance"], "default", True),
        ("inbox", ["finance"], "web", False),  # made over REST: not a webhook-only queue
        ("webhook:ops", ["finance"], "web", True),
        ("webhook:ops", ["finance"], "default", False),  # an endpoint's rule: its queues only
        ("webhook:audit", ["finance"], "audited", False),  # notify-only: decides nowhere
        (None, ["finance"], "web", True),  # kept before channels were recorded: roles only
        (None, None, "web", True),  # role policy: every queue
    ],
)
def test_a_rule_covers_only_queues_listing_its_deciding_channel(
    cfg: Config, channel: str | None, roles: list[str] | None, queue: str, covered: bool
) -> None:
    assert covers(cfg, rule(channel, roles), queue) is covered
