"""Fixtures of the integration tests: real Redis (the root conftest's), everything in this process.

A channel's integration tests live with the channel (tests/channels/<kind>/), with the fixtures
of its fakes in tests/channels/conftest.py."""

from __future__ import annotations
