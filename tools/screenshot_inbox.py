"""Regenerate docs/inbox.png: the inbox of `approval-broker up --demo`, as README shows it.

    uv run python tools/screenshot_inbox.py [--out docs/inbox.png]

Starts the embedded demo on a free port in a scratch data dir, waits for its three pending
requests, signs in with headless Chromium (Debian's `chromium`, driven by playwright), saves the
screenshot, and stops the demo (SIGINT, as Ctrl-C would). Nothing is left running.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from playwright.sync_api import expect, sync_playwright

from broker.redis.embedded import free_port

ADMIN = "ab_screenshot-admin-token"
DEMO_PENDING = 3  # two refund approvals and the A105 question
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run"]


def wait_for_demo(url: str, proc: subprocess.Popen[bytes], timeout: float = 120) -> None:
    """Until the demo's requests wait (or `up` died, or time ran out)."""
    deadline = time.monotonic() + timeout
    auth = {"Authorization": f"Bearer {ADMIN}"}
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"error: `up --demo` exited with {proc.returncode}")
        try:
            got = httpx.get(f"{url}/v1/requests", params={"status": "pending"}, headers=auth)
            if got.status_code == 200 and len(got.json()) >= DEMO_PENDING:
                return
        except httpx.HTTPError:
            pass  # not listening yet
        time.sleep(0.5)
    sys.exit(f"error: the demo's {DEMO_PENDING} requests did not appear in {timeout:.0f} s")


def screenshot(url: str, out: Path, chromium: str) -> None:
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            page.goto(url + "/")
            page.fill("#token", ADMIN)
            page.click("#signin-form button[type=submit]")
            expect(page.locator("article[data-request-id]")).to_have_count(DEMO_PENDING)
            expect(page.locator("#live")).to_contain_text("live")
            page.screenshot(path=str(out), full_page=True)
        finally:
            browser.close()


@contextmanager
def demo() -> Iterator[tuple[str, str]]:
    """`up --demo` on a free port in a scratch data dir, its requests waiting: yields its URL and
    the path of Chromium; stops it (SIGINT, as Ctrl-C would) however the block ends."""
    chromium = shutil.which("chromium")
    if chromium is None:
        sys.exit("error: no `chromium` on PATH (apt-get install chromium)")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPROVAL_BROKER_")}
    env["APPROVAL_BROKER_ADMIN_TOKEN"] = ADMIN
    with tempfile.TemporaryDirectory() as data_dir:
        command = [sys.executable, "-m", "approval_broker", "up", "--demo"]
        command += ["--port", str(port), "--data-dir", data_dir]
        proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_for_demo(url, proc)
            yield url, chromium
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parents[1] / "docs/inbox.png")
    out = parser.parse_args().out
    with demo() as (url, chromium):
        screenshot(url, out, chromium)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
