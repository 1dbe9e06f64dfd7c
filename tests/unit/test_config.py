"""The config is checked whole at load: dangling names and escalation loops are refused by key."""

from __future__ import annotations

import base64

import pytest

from broker.domain.config import load_config, parse_config
from broker.domain.errors import ConfigError
from broker.domain.settings import Settings, check_admin_token
from channels.email.config import email_section
from channels.slack.config import slack_section
from channels.webhook.config import webhook_endpoints

OPS_SECRET = "whsec_" + base64.b64encode(b"a-32-byte-key-for-the-ops-hook!!").decode()

GOOD = """
[queues.default]
channels = ["inbox", "webhook:ops", "slack:approvals", "email:leads"]
timeout_s = 600
escalate_to = "managers"

[queues.managers]
channels = ["slack:approvals"]
timeout_s = 1800

[webhooks.ops]
url = "https://example.com/hooks/approvals"
secret = "env:TEST_OPS_SECRET"
roles = ["ops"]

[slack]
bot_token = "env:TEST_SLACK_TOKEN"
signing_secret = "s3cret"
[slack.channels.approvals]
channel = "C0123456"

[email]
smtp_url = "smtp://localhost:1025"
from = "approvals@example.com"
public_url = "https://approvals.example.com"
[email.lists.leads]
to = ["lead@example.com"]

[approvers.alice]
token_sha256 = "62958c05fb865cfcdd0ee1b030266e7aaeb9c373d09dcf02f892eb1181ec5961"
roles = ["finance", "requester"]
slack_user_id = "U0123"
email = "alice@example.com"
"""


def test_full_config_loads_and_resolves_env_secrets(tmp_config, monkeypatch):
    monkeypatch.setenv("TEST_OPS_SECRET", OPS_SECRET)
    monkeypatch.setenv("TEST_SLACK_TOKEN", "xoxb-1")
    config = load_config(tmp_config(GOOD))
    assert webhook_endpoints(config)["ops"].secrets == [OPS_SECRET]
    assert (slack := slack_section(config)) is not None and slack.bot_token == "xoxb-1"
    assert (email := email_section(config)) is not None and email.from_ == "approvals@example.com"
    assert config.escalation_target("default") == "managers"
    assert config.timeout_for("managers") == 1800
    assert config.approvers["alice"].roles == ["finance", "requester"]


def test_no_config_means_one_inbox_queue():
    config = load_config(None)
    assert list(config.queues) == ["default"]
    assert config.queues["default"].channels == ["inbox"]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            {"queues": {"default": {"escalate_to": "nowhere"}}},
            "queues.default.escalate_to: queue 'nowhere'",
        ),
        (
            {"queues": {"default": {"channels": ["webhook:ops"]}}},
            "queues.default.channels[0]: webhook 'ops'",
        ),
        (
            {"queues": {"default": {"channels": ["slack:x"]}}},
            "queues.default.channels[0]: slack channel 'x'",
        ),
        (
            {"queues": {"default": {"channels": ["email:x"]}}},
            "queues.default.channels[0]: email list 'x'",
        ),
        ({"queues": {"default": {"channels": ["pager:x"]}}}, "unknown channel kind 'pager'"),
        ({"queues": {"default": {"channels": ["webhook"]}}}, "needs a name"),
        (
            {
                "queues": {
                    "a": {"escalate_to": "b"},
                    "b": {"escalate_to": "c"},
                    "c": {"escalate_to": "a"},
                }
            },
            "escalation loops: a -> b -> c -> a",
        ),
        ({"queues": {"a": {"escalate_to": "a"}}}, "escalation loops: a -> a"),
        (
            {
                "queues": {"default": {"roles": ["finance", "fiannce"]}},
                "approvers": {"al": {"roles": ["finance"]}},
            },
            "queues.default.roles[1]: role 'fiannce' is held by no approver or webhook endpoint",
        ),
        (
            {"email": {"lists": {"l": {"to": ["a@x"], "unmapped_may_decide": "maybe"}}}},
            "email.lists.l.unmapped_may_decide",
        ),
        ({"queues": {"default": {"timeout_s": -1}}}, "queues.default.timeout_s"),
        ({"queues": {"default": {"colour": "red"}}}, "queues.default.colour"),
        ({"agents": {"x": {"path": "m:a", "queue": "nope"}}}, "agents.x.queue: queue 'nope'"),
        ({"approvers": {"bob": {"token_sha256": "short"}}}, "approvers.bob.token_sha256"),
        (
            {"webhooks": {"w": {"url": "http://x", "secret": "plainsecret"}}},
            "webhooks.w.secret: must start with 'whsec_'",
        ),
        (
            {"webhooks": {"w": {"url": "http://x", "secret": "whsec_not*base64!"}}},
            "webhooks.w.secret: must be 'whsec_' followed by base64",
        ),
        (
            {"webhooks": {"w": {"url": "http://x", "secret": "whsec_abc="}}},
            "must decode to 24 to 64 bytes",
        ),
        (
            {"webhooks": {"w": {"url": "http://x", "secret": []}}},
            "webhooks.w.secret: must start with 'whsec_'",
        ),
        (
            {
                "webhooks": {
                    "w": {"url": "http://x", "secret": OPS_SECRET, "events": ["approval.acked"]}
                }
            },
            "webhooks.w.events: unknown event type 'approval.acked'",
        ),
        (
            {"webhooks": {"w": {"url": "http://x", "secret": OPS_SECRET, "events": []}}},
            "webhooks.w.events: names no event type",
        ),
    ],
)
def test_bad_config_is_refused_naming_the_key(raw, message):
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_env_secret_names_key_and_variable(monkeypatch):
    monkeypatch.delenv("NOPE_SECRET", raising=False)
    raw = {"webhooks": {"ops": {"url": "http://x", "secret": "env:NOPE_SECRET"}}}
    with pytest.raises(
        ConfigError, match=r"webhooks\.ops\.secret names environment variable NOPE_SECRET"
    ):
        parse_config(raw)


def test_broken_toml_and_missing_file_are_clear(tmp_config, tmp_path):
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(tmp_config("[queues.default\nchannels = 1"))
    with pytest.raises(ConfigError, match="cannot read it"):
        load_config(tmp_path / "absent.toml")


def test_queue_roles_and_unmapped_addresses_load():
    config = parse_config(
        {
            "queues": {"default": {"channels": ["email:l"], "roles": ["ops", "finance"]}},
            "webhooks": {
                "w": {
                    "url": "http://x",
                    "secret": "whsec_dGVzdC1zZWNyZXQtZm9yLXRoZS1vcHMtd2ViaG9vayE=",
                    "roles": ["ops"],
                }
            },
            "approvers": {"al": {"roles": ["finance"]}},
            "email": {"lists": {"l": {"to": ["a@x"], "unmapped_may_decide": True}}},
        }
    )
    assert config.queue_roles("default") == ["ops", "finance"]  # ops: held by the endpoint
    assert config.queue_roles("nowhere") == []
    assert (email := email_section(config)) is not None and email.lists["l"].unmapped_may_decide
    default = email_section(parse_config({"email": {"lists": {"l": {"to": []}}}}))
    assert default is not None and default.lists["l"].unmapped_may_decide is False


@pytest.mark.parametrize(("token", "ok"), [(None, True), ("x" * 24, True), ("x" * 23, False)])
def test_an_admin_token_needs_24_characters(token, ok):
    settings = Settings(admin_token=token)
    if ok:
        check_admin_token(settings)
        return
    with pytest.raises(ConfigError) as info:
        check_admin_token(settings)
    assert "at least 24" in str(info.value) and "x" * 23 not in str(info.value)
