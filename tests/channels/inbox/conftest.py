"""Fixtures of the inbox's browser tests: headless Chromium and an `up --demo` to drive."""

from __future__ import annotations

from tests.support.browser import chromium, demo  # noqa: F401 - fixtures
