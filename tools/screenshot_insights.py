"""Regenerate docs/insights.png: the Insights page of `approval-broker up --demo`, as
docs/insights.md shows it.

    uv run python tools/screenshot_insights.py [--out docs/insights.png]

Starts the embedded demo as tools/screenshot_inbox.py does, waits for its pending requests,
makes a little history over the API (a refund rejected with a reason, the question answered,
a rule that routes big refunds), signs in with headless Chromium on /insights, saves the
screenshot once the charts are drawn, and stops the demo. Nothing is left running.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import httpx
from playwright.sync_api import expect, sync_playwright
from screenshot_inbox import ADMIN, CHROMIUM_ARGS, demo


def make_history(url: str) -> None:
    """Decide the demo's waiting requests: the tent refund rejected, the shoes approved, the
    A105 question answered."""
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN}"}) as http:
        pending = http.get("/v1/requests", params={"status": "pending"}).json()
        for r in pending:
            if r["kind"] == "question":
                answer = {"answers": [{"question": r["metadata"]["questions"][0]["question"],
                                       "selected": ["Card"], "other": None}]}  # fmt: skip
                body = {"outcome": "answered", "answer": answer}
            elif r["args"].get("order_id") == "A103":
                body = {"outcome": "rejected", "reason": "The tent was used for a season."}
            else:
                body = {"outcome": "approved"}
            http.post(f"/v1/requests/{r['id']}/decision", json=body).raise_for_status()


def screenshot(url: str, out: Path, chromium: str) -> None:
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 1000})
            page.goto(url + "/insights")
            page.fill("#token", ADMIN)
            page.click("#signin-form button[type=submit]")
            expect(page.locator("#live")).to_contain_text("live")
            expect(page.locator("#reasons")).to_contain_text("used for a season")
            expect(page.locator("#chart-outcomes")).to_have_attribute("data-drawn", "3")
            page.screenshot(path=str(out), full_page=True)
        finally:
            browser.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parents[1] / "docs/insights.png")
    out = parser.parse_args().out
    with demo() as (url, chromium):
        make_history(url)
        screenshot(url, out, chromium)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
