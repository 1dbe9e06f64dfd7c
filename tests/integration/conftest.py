"""Fixtures of the integration tests: real Redis (the root conftest's), everything in this process."""

from __future__ import annotations

from tests.support.slack_api import fake_slack  # noqa: F401 - the fixture
