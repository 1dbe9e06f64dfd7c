"""A mail's size is bounded whatever a request holds: arguments and prompt shown cut, with where
to read them in full.

A request with 900 KB of `args` used to go out to each recipient twice (plain text and HTML).
Through the real notifier and an SMTP server (aiosmtpd), each mail now stays small, shows the
start of the arguments, says how much more there is, and points at the full request.
"""

from __future__ import annotations

import pytest
from redis import Redis

from broker.domain.config import parse_config
from broker.domain.models import NewRequest
from broker.facade import Broker
from tests.support.fakes.harness import running
from tests.support.fakes.smtp import SmtpSink
from tests.support.waiting import wait_for

PUBLIC = "http://approvals.test"
APPROVER = "fin@example.com"
ONLOOKER = "someone@example.com"
MAX_MAIL_BYTES = 48 * 1024
MAX_ARGS_SHOWN = 4000  # channels.email.render.MAX_ARGS_SHOWN


@pytest.fixture
def broker(redis: Redis, smtp: SmtpSink) -> Broker:
    config = parse_config(
        {
            "queues": {"default": {"channels": ["email:team"]}},
            "email": {
                "smtp_url": smtp.url,
                "from": "approvals@example.com",
                "public_url": PUBLIC,
                "lists": {"team": {"to": [APPROVER, ONLOOKER]}},
            },
            "approvers": {"fin": {"roles": ["finance"], "email": APPROVER}},
        }
    )
    return Broker(redis, config, prefix="t:")


def test_a_request_with_900_kb_of_args_mails_a_bounded_cut_with_a_way_to_the_rest(
    broker: Broker, smtp: SmtpSink
) -> None:
    args = {"note": "start-marker " + "x" * 900_000 + " end-marker", "amount": 5}
    with running(broker):
        request = broker.create_request(
            NewRequest(tool_name="refund", args=args, prompt="p" * 20_000)
        )
        wait_for(lambda: len(smtp.mails) == 2, timeout=30)
    mails = {m.rcpt_tos[0]: m for m in smtp.mails}
    assert set(mails) == {APPROVER, ONLOOKER}
    for who, mail in mails.items():
        size = len(mail.message.as_bytes())
        assert size < MAX_MAIL_BYTES, (who, size)
        plain, html = mail.part("plain"), mail.part("html")
        for body in (plain, html):
            assert "start-marker" in body and "end-marker" not in body
            assert "more characters of the arguments" in body
            assert "more characters of the prompt" in body
            assert f"{PUBLIC}/" in body
        assert request.id in plain
    # the approver's mail has links, whose page shows the whole request
    assert "on the page each link below opens" in mails[APPROVER].part("plain")
    assert "/v1/email/" in mails[APPROVER].part("plain")
    assert "/v1/email/" not in mails[ONLOOKER].part("plain")


def test_small_args_are_shown_whole(broker: Broker, smtp: SmtpSink) -> None:
    args = {"order_id": "A1", "note": "y" * (MAX_ARGS_SHOWN - 100)}
    with running(broker):
        broker.create_request(NewRequest(tool_name="refund", args=args, prompt="Refund A1?"))
        wait_for(lambda: len(smtp.mails) == 2, timeout=30)
    for mail in smtp.mails:
        plain = mail.part("plain")
        assert "y" * (MAX_ARGS_SHOWN - 100) in plain
        assert "more characters" not in plain and "Refund A1?" in plain
