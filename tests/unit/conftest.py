"""Fixtures of the unit tests: no Redis, no process, no server."""

from __future__ import annotations
