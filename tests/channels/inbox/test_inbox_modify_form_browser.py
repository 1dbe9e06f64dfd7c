"""The inbox's modify form in headless Chromium against `up --demo`: it shows the tool's args
schema and refuses args that don't meet it before sending anything."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.support.browser import CHROMIUM_ARGS, demo_pending  # noqa: F401
from tests.support.up import ADMIN, stop_up

pytestmark = pytest.mark.system  # processes and browsers: tests/conftest.py spreads these


def test_the_modify_form_shows_the_schema_and_checks_args_before_sending(
    chromium: str,  # noqa: F811 - the fixture
    demo,  # noqa: ANN001, F811 - the fixture
    tmp_path: Path,
) -> None:
    from playwright.sync_api import expect, sync_playwright

    proc, url = demo
    http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10)
    request = demo_pending(http)[0]["A100"]
    assert request["args_schema"]["properties"]["amount"]["type"] == "number"

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1100, "height": 900})
        page.goto(url + "/")
        page.fill("#token", ADMIN)
        page.click("#signin-form button[type=submit]")
        card = page.locator(f"article[data-request-id='{request['id']}']")
        card.locator("[data-action=modify-open]").click()
        fields = card.locator(".schema-fields")
        expect(fields.locator("li[data-field=amount]")).to_contain_text("amount: number (required)")
        expect(fields.locator("li[data-field=order_id]")).to_contain_text("string")

        card.locator(".new-args").fill(json.dumps({**request["args"], "amount": "lots"}))
        card.locator(".confirm-modify").click()
        expect(card.locator(":scope > .error")).to_contain_text("args.amount: must be number")
        card.locator(".new-args").fill(json.dumps({"order_id": "A100"}))
        card.locator(".confirm-modify").click()
        expect(card.locator(":scope > .error")).to_contain_text("is required")
        # refused in the page: nothing reached the broker
        assert http.get(f"/v1/requests/{request['id']}").json()["status"] == "pending"

        card.locator(".new-args").fill(json.dumps({**request["args"], "amount": 50}))
        card.locator(".confirm-modify").click()
        expect(page.locator(f"article[data-request-id='{request['id']}']")).to_have_count(0)
        browser.close()

    decided = http.get(f"/v1/requests/{request['id']}").json()
    assert decided["status"] == "modified" and decided["decision"]["args"]["amount"] == 50
    http.close()
    stop_up(proc)
