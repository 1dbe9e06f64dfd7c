"""The inbox's escalate dropdown in headless Chromium: a person is offered only the queues of
the request's `escalate_to` chain (what the broker lets them do); the admin, every other queue."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from redis import Redis

from api.app import create_app
from api.testing import ServerThread
from broker.domain.config import parse_config
from broker.domain.models import NewRequest
from broker.domain.settings import Settings
from broker.facade import Broker
from tests.support.auth import person
from tests.support.browser import CHROMIUM_ARGS  # noqa: F401

pytestmark = pytest.mark.system  # processes and browsers: tests/conftest.py spreads these

ADMIN = "tok-admin-fixups-inbox-0123456789"
ALICE = "tok-alice-fixups-inbox-0123456789"


@pytest.fixture
def served(redis: Redis) -> Iterator[tuple[str, Broker]]:
    inbox = {"channels": ["inbox"], "timeout_s": 600}
    config = parse_config(
        {
            "queues": {
                "default": {**inbox, "escalate_to": "managers"},
                "managers": {**inbox, "escalate_to": "directors"},
                "directors": inbox,
                "unrelated": inbox,
            },
            "approvers": {"alice": person(ALICE, ["ops"])},
        }
    )
    broker = Broker(redis, config, prefix="t:")
    app = create_app(Settings(admin_token=ADMIN), config, broker)
    with ServerThread(app) as server:
        yield server.url, broker


def offered(chromium: str, url: str, token: str, request_id: str) -> list[str]:  # noqa: F811
    """The escalation targets the inbox offers `token` for one request ([] if no button)."""
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1100, "height": 900})
        page.goto(url + "/")
        page.fill("#token", token)
        page.click("#signin-form button[type=submit]")
        card = page.locator(f"article[data-request-id='{request_id}']")
        expect(card).to_have_count(1)
        expect(card.locator("[data-action=reject-open]")).to_have_count(1)  # actions are drawn
        if card.locator("[data-action=escalate-open]").count() == 0:
            browser.close()
            return []
        names = card.locator(".target option").evaluate_all("os => os.map(o => o.value)")
        browser.close()
        return names


def test_the_escalate_dropdown_lists_only_the_chain_for_a_person_and_all_for_the_admin(
    chromium: str,  # noqa: F811 - the fixture
    served: tuple[str, Broker],
) -> None:
    url, broker = served
    first = broker.create_request(NewRequest(tool_name="refund", queue="default"))
    last = broker.create_request(NewRequest(tool_name="refund", queue="directors"))
    assert offered(chromium, url, ALICE, first.id) == ["managers", "directors"]
    assert offered(chromium, url, ALICE, last.id) == []  # the end of the chain: no button
    assert offered(chromium, url, ADMIN, first.id) == ["directors", "managers", "unrelated"]
