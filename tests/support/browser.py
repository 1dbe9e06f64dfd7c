"""Headless Chromium for the inbox's browser tests, and an `up --demo` to drive."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.debian import debian_program
from tests.support.up import healthy, start_up
from tests.support.waiting import wait_for

CHROMIUM_ARGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


@pytest.fixture(scope="session")
def chromium() -> str:
    return debian_program("chromium", "chromium")


@contextmanager
def signed_in(chromium: str, url: str, token: str, **page_options: Any) -> Iterator[Any]:
    """A Chromium page on the inbox at `url`, signed in with `token`; closed on exit."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(**page_options)
            page.goto(url + "/")
            page.fill("#token", token)
            page.click("#signin-form button[type=submit]")
            yield page
        finally:
            browser.close()


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[tuple[object, str]]:
    proc, url = start_up(tmp_path, "--demo")
    try:
        wait_for(lambda: healthy(url) or proc.poll() is not None, timeout=60)
        assert proc.poll() is None
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def demo_pending(http: httpx.Client) -> tuple[dict[str, dict], dict]:
    """What `up --demo` leaves waiting: its two refund approvals (by order) and the A105 question."""
    pending = wait_for(
        lambda: len(r := http.get("/v1/requests", params={"status": "pending"}).json()) == 3 and r,
        timeout=60,
    )
    approvals = {r["args"]["order_id"]: r for r in pending if r["kind"] == "approval"}
    [asked] = [r for r in pending if r["kind"] == "question"]
    assert set(approvals) == {"A103", "A100"}
    assert asked["metadata"]["questions"][0]["question"].startswith("Refund order A105")
    return approvals, asked
