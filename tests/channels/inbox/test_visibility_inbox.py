"""The inbox in a real browser: the pending count is the queue's true total, long lists page
with "More", and an approver's page shows only the requests it may see."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from redis import Redis

from api.app import create_app
from api.testing import ServerThread
from broker.domain.config import Config, parse_config
from broker.domain.models import NewRequest
from broker.domain.settings import Settings
from broker.facade import Broker
from tests.support.auth import person
from tests.support.browser import CHROMIUM_ARGS  # noqa: F401

pytestmark = pytest.mark.system  # processes and browsers: tests/conftest.py spreads these

ADMIN = "tok-admin-0123456789abcdefghij"


@pytest.fixture
def served(redis: Redis) -> Iterator[tuple[str, Broker]]:
    cfg: Config = parse_config(
        {
            "queues": {"default": {"channels": ["inbox"]}},
            "approvers": {"ops": person("tok-ops", ["ops"])},
        }
    )
    broker = Broker(redis, cfg, prefix="t:")
    with ServerThread(create_app(Settings(admin_token=ADMIN), cfg, broker)) as server:
        yield server.url, broker


def test_inbox_counts_pages_and_shows_only_what_may_be_seen(
    chromium: str,  # noqa: F811
    served: tuple[str, Broker],
) -> None:
    from playwright.sync_api import expect, sync_playwright

    url, broker = served
    broker.create_requests([NewRequest(tool_name="refund", args={"i": i}) for i in range(60)])
    broker.create_requests([NewRequest(tool_name="wire", allowed_roles=["finance"])] * 5)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        for token, total_cards in ((ADMIN, 65), ("tok-ops", 60)):
            page = browser.new_page()
            page.goto(url + "/")
            page.fill("#token", token)
            page.click("#signin-form button[type=submit]")
            cards = page.locator("article[data-request-id]")
            expect(cards).to_have_count(50)  # one page
            expect(page.locator("#pending-count")).to_have_text("(65)")  # the queue's total
            page.click("#more")
            expect(cards).to_have_count(total_cards)
            expect(page.locator("#more")).to_be_hidden()
            if token != ADMIN:
                expect(page.locator("article .tool", has_text="wire")).to_have_count(0)
            page.close()
        browser.close()
