"""The inbox in headless Chromium against `up --demo`: someone typing in a card's form keeps the
focus and every key while live events re-render the list around that card.

Each event (a request created, decided, escalated) refreshes the list. A card whose form is open
is kept; if it were taken out of the page and put back, the browser would move the focus away
from its text box, and the rest of what the approver types (on a phone: the keyboard closes)
would be lost.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.support.browser import demo_pending, signed_in
from tests.support.up import ADMIN, stop_up

pytestmark = pytest.mark.system  # processes and browsers: tests/conftest.py spreads these


def test_a_reason_being_typed_keeps_the_focus_and_every_key_while_events_refresh_the_list(
    chromium: str,
    demo: tuple[Any, str],
) -> None:
    from playwright.sync_api import expect

    proc, url = demo
    http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10)
    approvals, _ = demo_pending(http)
    refund = approvals["A100"]

    with signed_in(chromium, url, ADMIN, viewport={"width": 1100, "height": 1400}) as page:
        expect(page.locator("#live")).to_have_text("● live", timeout=20_000)
        cards = page.locator("article[data-request-id]")
        expect(cards).to_have_count(3, timeout=20_000)
        card = page.locator(f"article[data-request-id='{refund['id']}']")
        card.locator("[data-action=reject-open]").click()
        reason = card.locator(".reason")
        expect(reason).to_be_focused()
        page.keyboard.type("Too large ")

        # events: a request created (a new card in the list), another one decided (a card gone)
        created = http.post(
            "/v1/requests", json={"tool_name": "send_email", "args": {"to": "ana@example.com"}}
        )
        assert created.status_code == 201, created.text
        expect(cards).to_have_count(4)
        above = approvals["A103"]
        decided = http.post(f"/v1/requests/{above['id']}/decision", json={"outcome": "approved"})
        assert decided.status_code == 200, decided.text
        expect(cards).to_have_count(3)

        expect(reason).to_be_focused()
        page.keyboard.type("for one order.")
        expect(reason).to_have_value("Too large for one order.")
        card.locator(".confirm-reject").click()
        expect(card).to_have_count(0)

    rejected = http.get(f"/v1/requests/{refund['id']}").json()
    assert rejected["status"] == "rejected"
    assert rejected["decision"]["reason"] == "Too large for one order."
    http.close()
    stop_up(proc)
