"""The Insights page in headless Chromium against `up --demo`: its charts are drawn (SVG from the
vendored chart library, served by the broker itself), the window picker asks `/v1/stats` for
another window, and a decision made meanwhile shows without a reload (the page follows
`/v1/events`, as the inbox does); the inbox, a link away, shows a routed request's risk."""

from __future__ import annotations

import httpx
import pytest

from tests.support.browser import CHROMIUM_ARGS, demo_pending
from tests.support.up import ADMIN, stop_up

pytestmark = pytest.mark.system  # processes and browsers: tests/conftest.py spreads these


def test_insights_draws_charts_picks_a_window_and_updates_live(chromium: str, demo) -> None:
    from playwright.sync_api import expect, sync_playwright

    proc, url = demo
    http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10)
    approvals, _ = demo_pending(http)
    lib = http.get("/inbox/static/chartist-1.5.0.umd.js")
    assert lib.status_code == 200 and lib.headers["content-type"].startswith("text/javascript")
    assert http.get("/inbox/static/..%2Fapp.py").status_code == 404
    before = http.get("/v1/stats").json()
    asked: list[str] = []

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1200, "height": 1000})
        page.on("request", lambda r: asked.append(r.url))
        page.goto(url + "/insights")
        page.fill("#token", ADMIN)
        page.click("#signin-form button[type=submit]")
        expect(page.locator("#live")).to_contain_text("live")
        total = str(before["requests"]["total"])
        expect(page.locator("#t-total")).to_have_text(total)
        # the charts are drawn: bars and slices in SVG
        expect(page.locator("#chart-queues svg .ct-bar")).to_have_count(
            len(before["requests"]["by_queue"])
        )
        assert page.locator("#chart-tools svg .ct-bar").count() >= 1
        assert page.locator("#chart-deciders svg path.ct-slice-donut").count() >= 1
        expect(page.locator("#chart-queues")).to_have_attribute("data-drawn", "1")
        assert page.locator("#chart-queues .ct-label").first.inner_text() == "default"
        # a decision meanwhile shows without a reload
        shoes = approvals["A100"]
        decided = http.post(
            f"/v1/requests/{shoes['id']}/decision",
            json={"outcome": "rejected", "reason": "not this time"},
        )
        assert decided.status_code == 200, decided.text
        expect(page.locator("#reasons")).to_contain_text("not this time")
        expect(page.locator("#t-rejected")).to_have_text(
            str(before["requests"]["by_outcome"].get("rejected", 0) + 1)
        )
        # the window picker: a custom window in the past has nothing
        page.select_option("#window", "custom")
        page.fill("#since", "2020-01-01T00:00")
        page.fill("#until", "2020-01-02T00:00")
        page.click("#picker button[type=submit]")
        expect(page.locator("#t-total")).to_have_text("0")
        expect(page.locator("#chart-queues")).to_contain_text("Nothing in this window")
        page.select_option("#window", "168")
        expect(page.locator("#t-total")).to_have_text(total)
        # a routed request's risk label on its inbox card (same tab: still signed in)
        rule = {"effect": "route", "tool": "wire", "route": {"risk": "high: wire"}}
        assert http.post("/v1/rules", json=rule).status_code == 201
        routed = http.post("/v1/requests", json={"tool_name": "wire", "args": {"amount": 9}})
        assert routed.status_code == 201 and routed.json()["risk"] == "high: wire"
        page.click("header a[href='/']")  # ← Inbox
        card = page.locator(f"article[data-request-id='{routed.json()['id']}']")
        expect(card.locator(".tag.risk")).to_have_text("risk: high: wire")
        page.click("#insights-link")
        expect(page.locator("#t-total")).to_have_text(str(before["requests"]["total"] + 1))
        browser.close()

    assert not [u for u in asked if not u.startswith(url)]  # nothing from anywhere else
    http.close()
    out = stop_up(proc)
    assert proc.returncode == 0, out
