"""A list's addresses that differ only in case are one mailbox and one person: one mail each.

Votes already count once per person (`broker.domain.persons`); here the notifier sends one mail to
`ext@` and `EXT@` together, through the real notifier and an SMTP server (aiosmtpd).
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


@pytest.fixture
def broker(redis: Redis, smtp: SmtpSink) -> Broker:
    config = parse_config(
        {
            "queues": {"default": {"channels": ["email:team"]}},
            "email": {
                "smtp_url": smtp.url,
                "from": "approvals@example.com",
                "public_url": "http://approvals.test",
                "lists": {
                    "team": {
                        "to": ["ext@example.com", "EXT@example.com", "other@example.com"],
                        "unmapped_may_decide": True,
                    }
                },
            },
        }
    )
    return Broker(redis, config, prefix="t:")


def test_addresses_differing_only_in_case_get_one_mail(broker: Broker, smtp: SmtpSink) -> None:
    with running(broker):
        request = broker.create_request(NewRequest(tool_name="refund", args={"amount": 5}))
        delivered = wait_for(
            lambda: [
                h
                for h in broker.get_request(request.id).history
                if h.event == "delivered" and h.channel == "email:team"
            ],
            timeout=30,
        )
    assert delivered
    recipients = sorted(address for mail in smtp.mails for address in mail.rcpt_tos)
    assert recipients == ["ext@example.com", "other@example.com"]
