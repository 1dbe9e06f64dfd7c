"""Fixtures of the system tests: whole processes, browsers, clusters and servers started for real."""

from __future__ import annotations

from tests.support.browser import chromium, demo  # noqa: F401 - fixtures
from tests.support.mcp_world import world  # noqa: F401 - the fixture
