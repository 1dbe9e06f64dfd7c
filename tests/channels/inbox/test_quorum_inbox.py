"""The inbox shows a request's votes ("1 of 2 approvals: alice") and says "I'm on it"."""

from __future__ import annotations

import pytest
from redis import Redis

from api.app import create_app
from api.testing import ServerThread
from broker.domain.config import parse_config
from broker.domain.models import Decision, NewRequest
from broker.domain.settings import Settings
from broker.facade import Broker
from tests.support.browser import CHROMIUM_ARGS  # noqa: F401

pytestmark = pytest.mark.system  # processes and browsers: tests/conftest.py spreads these

ADMIN = "admin-token-for-the-quorum-inbox-test"


def test_inbox_shows_votes_and_acks(chromium: str, redis: Redis) -> None:  # noqa: F811
    from playwright.sync_api import expect, sync_playwright

    cfg = parse_config(
        {"queues": {"default": {"channels": ["inbox"], "quorum": 2, "escalate_to": "managers"},
                    "managers": {"channels": ["inbox"]}},
         "approvers": {"alice": {"roles": ["ops"]}}}
    )  # fmt: skip
    broker = Broker(redis, cfg, prefix="t:")
    req = broker.create_request(NewRequest(tool_name="refund", args={"amount": 500}))
    broker.decide(req.id, Decision(outcome="approved"), decided_by="alice")
    app = create_app(Settings(admin_token=ADMIN), cfg, broker)
    with ServerThread(app) as server, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.goto(server.url + "/")
        page.fill("#token", ADMIN)
        page.click("#signin-form button[type=submit]")
        card = page.locator(f"article[data-request-id='{req.id}']")
        expect(card.locator(".votes")).to_have_text("1 of 2 approvals: alice")
        card.locator("[data-action=ack]").click()
        expect(card.locator(".votes")).to_contain_text("admin is on it until")
        expect(card.locator(".history")).to_contain_text("admin is on it via inbox")
        browser.close()
    stored = broker.get_request(req.id)
    assert stored.is_pending and stored.acked_by == "admin"
    assert [v.by for v in stored.approvals] == ["alice"]  # the ack is no vote
