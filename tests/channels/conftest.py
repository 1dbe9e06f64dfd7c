"""Fixtures of the channels' tests (one folder per kind, and the tests that span kinds here):
real Redis (the root conftest's), the platform fakes of tests/support/fakes, the API in-process.

A kind's folder holds its unit, integration and system tests alike; a module that starts
processes or browsers says so with `pytestmark = pytest.mark.system`, one with no Redis and no
server with `pytest.mark.unit` (tests/conftest.py orders the run by those marks).
"""

from __future__ import annotations

from tests.support.slack_api import fake_slack  # noqa: F401 - the fixture
