"""The inbox in headless Chromium against `up --demo`: sign in, decide the demo requests, live updates.

Chromium is Debian's package; the fixture installs it when it is missing (CI runs as root).
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.support.browser import demo_pending, signed_in  # noqa: F401
from tests.support.up import ADMIN, stop_up
from tests.support.waiting import wait_for

pytestmark = pytest.mark.system  # processes and browsers: tests/conftest.py spreads these


def test_inbox_decides_both_demo_requests_live(chromium: str, demo, tmp_path: Path):
    from playwright.sync_api import expect

    proc, url = demo
    http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10)
    by_order, asked = demo_pending(http)

    with signed_in(chromium, url, ADMIN, viewport={"width": 1100, "height": 900}) as page:
        cards = page.locator("article[data-request-id]")
        expect(cards).to_have_count(3)
        expect(page.locator("#whoami")).to_contain_text("admin")
        expect(page.locator("#live")).to_contain_text("live")

        # something new arrives while the page is open: it appears without a reload
        extra = http.post(
            "/v1/requests", json={"tool_name": "email_customer", "args": {"to": "c-17"}}
        )
        assert extra.status_code == 201
        expect(cards).to_have_count(4, timeout=10_000)
        page.screenshot(path=str(tmp_path / "inbox.png"), full_page=True)
        http.post(
            f"/v1/requests/{extra.json()['id']}/decision",
            json={"outcome": "rejected", "reason": "n/a"},
        )
        expect(cards).to_have_count(3, timeout=10_000)

        torn = page.locator(f"article[data-request-id='{by_order['A103']['id']}']")
        torn.locator("[data-action=reject-open]").click()
        torn.locator(".confirm-reject").click()  # no reason yet: refused in the page
        expect(torn.locator(":scope > .error")).to_contain_text("Say why")
        torn.locator(".reason").fill("The photos show wear, not a torn floor.")
        torn.locator(".confirm-reject").click()
        expect(cards).to_have_count(2)

        page.locator(
            f"article[data-request-id='{by_order['A100']['id']}'] [data-action=approve]"
        ).click()
        expect(cards).to_have_count(1)

        # the demo's question shows its form: card or store credit
        refund = page.locator(f"article[data-request-id='{asked['id']}']")
        refund.locator("[data-action=answer-open]").click()
        refund.get_by_label("Card", exact=True).check()
        refund.locator(".confirm-questions").click()
        expect(cards).to_have_count(0)
        expect(page.locator(".empty")).to_contain_text("Nothing waits for you")

        page.click("#tab-done")
        expect(page.locator("article[data-status=rejected]")).to_have_count(2)
        # A100 by a person, and the rule demo's refund by rule demo-routine-refunds
        expect(page.locator("article[data-status=approved]")).to_have_count(2)

    runs = {order: by_order[order]["run_id"] for order in by_order} | {"A105": asked["run_id"]}
    finished = {
        order: wait_for(
            lambda rid=rid: (r := http.get(f"/v1/runs/{rid}").json())["status"] == "finished" and r
        )
        for order, rid in runs.items()
    }
    assert finished["A100"]["output"]["refunded"] is True
    assert finished["A100"]["output"]["amount"] == 75
    assert finished["A103"]["output"]["refunded"] is False
    assert finished["A105"]["output"]["refunded"] is True  # $45: under the limit once answered
    assert "wear" in finished["A103"]["output"]["message"]
    assert (
        http.get(f"/v1/requests/{by_order['A103']['id']}")
        .json()["decision"]["reason"]
        .startswith("The photos")
    )
    http.close()
    out = stop_up(proc)
    assert proc.returncode == 0, out
