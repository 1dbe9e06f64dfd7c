"""The inbox's "Approve always…" in headless Chromium against `up --demo`: the rule demo's run
was decided by its rule with nobody asked, and approving a waiting refund "always, for this
agent" keeps that rule and lets the run finish."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.support.browser import CHROMIUM_ARGS, demo_pending  # noqa: F401
from tests.support.up import ADMIN, stop_up
from tests.support.waiting import wait_for

pytestmark = pytest.mark.system  # processes and browsers: tests/conftest.py spreads these


def test_inbox_offers_approve_always_and_keeps_the_rule(chromium: str, demo, tmp_path: Path):  # noqa: F811
    from playwright.sync_api import expect, sync_playwright

    proc, url = demo
    http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10)
    shoes = demo_pending(http)[0]["A100"]
    ruled = wait_for(
        lambda: [
            r
            for r in http.get("/v1/requests", params={"status": "approved"}).json()
            if (r.get("decision") or {}).get("rule") == "demo-routine-refunds"
        ],
        timeout=60,
    )
    assert ruled[0]["decision"]["decided_by"] == "rule:demo-routine-refunds"

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1100, "height": 900})
        page.goto(url + "/")
        page.fill("#token", ADMIN)
        page.click("#signin-form button[type=submit]")
        cards = page.locator("article[data-request-id]")
        expect(cards).to_have_count(3)  # A103, A100 and the A105 question
        card = page.locator(f"article[data-request-id='{shoes['id']}']")
        card.locator("[data-action=always-approve-open]").click()
        options = card.locator(".rule option")
        expect(options).to_have_count(len(shoes["suggested_rules"]))
        expect(options.nth(1)).to_contain_text("issue_refund for agent refunds")
        card.locator(".rule").select_option("1")
        card.locator(".confirm-always").click()
        expect(cards).to_have_count(2)
        browser.close()

    [rule] = [r for r in http.get("/v1/rules").json() if r["from_request"] == shoes["id"]]
    assert rule["agent"] == "refunds" and rule["created_by"] == "admin"
    run = wait_for(
        lambda: (r := http.get(f"/v1/runs/{shoes['run_id']}").json())["status"] == "finished" and r,
        timeout=60,
    )
    assert run["output"]["refunded"] is True
    http.close()
    out = stop_up(proc)
    assert proc.returncode == 0, out
