"""Decision links go only to list members who may decide, by the decision service's own rule."""

from __future__ import annotations

import re
from typing import Any

from redis import Redis

from broker.domain.config import parse_config
from broker.domain.models import NewRequest
from broker.facade import Broker
from broker.judge import Judge
from channels.email.deciders import email_decider
from channels.email.links import read_link
from tests.support.fakes.harness import running
from tests.support.fakes.smtp import SmtpSink
from tests.support.waiting import wait_for

PUBLIC = "http://approvals.test"
FINANCE = "fin@example.com"  # approver with finance
OPS = "ops@example.com"  # approver with ops only
STRANGER = "stranger@example.com"  # no approver has it
OPEN_STRANGER = "open@example.com"  # no approver has it, on a list that lets such decide


def make_broker(redis: Redis, smtp: SmtpSink, queue_roles: list[str] | None = None) -> Broker:
    raw: dict[str, Any] = {
        "queues": {
            "default": {
                "channels": ["email:team", "email:open"],
                **({"roles": queue_roles} if queue_roles else {}),
            }
        },
        "email": {
            "smtp_url": smtp.url,
            "from": "approvals@example.com",
            "public_url": PUBLIC,
            "lists": {
                "team": {"to": [FINANCE, OPS, STRANGER]},
                "open": {"to": [OPEN_STRANGER], "unmapped_may_decide": True},
            },
        },
        "approvers": {
            "fin": {"roles": ["finance"], "email": FINANCE},
            "ops": {"roles": ["ops"], "email": OPS},
        },
    }
    return Broker(redis, parse_config(raw), prefix="t:")


def tokens_in(text: str) -> list[str]:
    return re.findall(re.escape(PUBLIC) + r"/v1/email/([A-Za-z0-9_.\-]+)", text)


def mails_by_recipient(broker: Broker, smtp: SmtpSink, n: int) -> dict[str, Any]:
    wait_for(lambda: len(smtp.mails) == n)
    return {m.rcpt_tos[0]: m for m in smtp.mails}


def test_links_go_only_to_those_who_may_decide_the_others_get_the_mail_without(
    redis: Redis, smtp: SmtpSink
) -> None:
    broker = make_broker(redis, smtp)
    with running(broker):
        request = broker.create_request(
            NewRequest(tool_name="refund", args={"order_id": "A1"}, allowed_roles=["finance"])
        )
        mails = mails_by_recipient(broker, smtp, 4)
    assert set(mails) == {FINANCE, OPS, STRANGER, OPEN_STRANGER}
    for who in (FINANCE,):
        claims = [read_link(broker, t, 3600) for t in tokens_in(mails[who].part("plain"))]
        assert sorted(c.action for c in claims) == ["approve", "reject"]
        assert {(c.queue, c.escalations) for c in claims} == {("default", 0)}
    for who in (OPS, STRANGER, OPEN_STRANGER):  # ops lacks finance; strangers have no roles
        plain, html = mails[who].part("plain"), mails[who].part("html")
        assert tokens_in(plain) == [] and tokens_in(html) == [] and "data-action" not in html
        assert "you can't decide this request" in plain and "data-refusal" in html
        assert request.id in plain  # they are still told what is asked
    assert "finance" in mails[OPS].part("plain")  # and why not


def test_an_unmapped_address_gets_links_only_where_its_list_says_so(
    redis: Redis, smtp: SmtpSink
) -> None:
    broker = make_broker(redis, smtp)
    with running(broker):
        broker.create_request(NewRequest(tool_name="refund", args={"order_id": "A1"}))
        mails = mails_by_recipient(broker, smtp, 4)
    with_links = {who for who, m in mails.items() if tokens_in(m.part("plain"))}
    assert with_links == {FINANCE, OPS, OPEN_STRANGER}
    assert "unmapped" not in mails[FINANCE].part("plain")
    assert tokens_in(mails[STRANGER].part("plain")) == []


def test_queue_roles_hold_for_mailed_links(redis: Redis, smtp: SmtpSink) -> None:
    broker = make_broker(redis, smtp, queue_roles=["ops"])
    with running(broker):
        broker.create_request(NewRequest(tool_name="refund", args={"order_id": "A1"}))
        mails = mails_by_recipient(broker, smtp, 4)
    with_links = {who for who, m in mails.items() if tokens_in(m.part("plain"))}
    assert with_links == {OPS}


def test_the_mail_rule_is_the_decision_services(redis: Redis, smtp: SmtpSink) -> None:
    """What the notifier mails links to and what a link may then decide never disagree."""
    broker = make_broker(redis, smtp)
    judge = Judge(broker)
    for roles in ([], ["finance"], ["ops"], ["nobody"]):
        request = broker.create_request(
            NewRequest(tool_name="refund", args={}, allowed_roles=roles)
        )
        with running(broker):
            mails = mails_by_recipient(broker, smtp, 4)
        for who, mail in mails.items():
            decider = email_decider(broker.config, who)
            may = judge.refusal(decider.principal, request, decider.via) is None
            assert bool(tokens_in(mail.part("plain"))) is may, (roles, who)
        smtp.mails.clear()
