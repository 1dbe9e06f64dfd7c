"""The inbox keeps an approver's place: pages opened with "More" stay open across live updates.

A live update (an SSE event) used to reload only the first page, so someone working through a
long queue was thrown back to the top with every new or decided request.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from redis import Redis

from api.app import create_app
from api.testing import ServerThread
from broker.domain.config import Config, parse_config
from broker.domain.models import Decision, NewRequest, Status
from broker.domain.settings import Settings
from broker.facade import Broker
from tests.support.browser import signed_in  # noqa: F401

pytestmark = pytest.mark.system  # processes and browsers: tests/conftest.py spreads these

ADMIN = "tok-admin-0123456789abcdefghij"


@pytest.fixture
def served(redis: Redis) -> Iterator[tuple[str, Broker]]:
    cfg: Config = parse_config({"queues": {"default": {"channels": ["inbox"]}}})
    broker = Broker(redis, cfg, prefix="t:")
    with ServerThread(create_app(Settings(admin_token=ADMIN), cfg, broker)) as server:
        yield server.url, broker


def pending_ids(broker: Broker) -> list[str]:
    """The pending listing as the API pages it (soonest expiry first, ties by id)."""
    return [r.id for r in broker.requests.list_page(status=Status.pending, limit=1000).items]


def card_ids(page) -> list[str]:
    return page.eval_on_selector_all(
        "article[data-request-id]", "nodes => nodes.map(n => n.dataset.requestId)"
    )


def test_live_updates_keep_the_pages_opened_with_more(
    chromium: str,  # noqa: F811
    served: tuple[str, Broker],
) -> None:
    from playwright.sync_api import expect

    url, broker = served
    made = broker.create_requests(
        [NewRequest(tool_name="refund", args={"i": i}) for i in range(120)]
    )
    with signed_in(chromium, url, ADMIN, viewport={"width": 1100, "height": 900}) as page:
        cards = page.locator("article[data-request-id]")
        expect(cards).to_have_count(50)
        expect(page.locator("#live")).to_contain_text("live")
        page.click("#more")
        expect(cards).to_have_count(100)  # two pages open, a third behind "More"
        page.locator("article[data-request-id]").nth(90).scroll_into_view_if_needed()
        scrolled = page.evaluate("window.scrollY")
        assert scrolled > 0

        # someone else decides a request of page 1: the event reloads both open pages
        first_page = pending_ids(broker)[:50]
        decided = next(r for r in made if r.id == first_page[3])
        broker.decide(decided.id, Decision(outcome="approved"), decided_by="elsewhere")
        expect(page.locator(f"article[data-request-id='{decided.id}']")).to_have_count(0)
        expect(cards).to_have_count(100)  # not thrown back to one page of 50
        expect(page.locator("#list")).to_have_attribute("data-pages", "2")
        assert card_ids(page) == pending_ids(broker)[:100]
        assert abs(page.evaluate("window.scrollY") - scrolled) < 900  # still where they were
        expect(page.locator("#more")).to_be_visible()

        # a new request arrives (it expires last, so it is on page 3): the cursor still leads there
        broker.create_request(NewRequest(tool_name="email_customer"))
        expect(page.locator("#pending-count")).to_have_text("(120)", timeout=10_000)
        page.click("#more")
        expect(cards).to_have_count(120)
        expect(page.locator("#more")).to_be_hidden()
        ids = card_ids(page)
        assert ids == pending_ids(broker) and len(set(ids)) == 120  # each once, in order

        # a new tab starts from the top again
        page.click("#tab-done")
        page.click("#tab-pending")
        expect(cards).to_have_count(50)
        expect(page.locator("#list")).to_have_attribute("data-pages", "1")
