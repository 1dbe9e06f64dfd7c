"""Ids of requests and runs, and what a request id says about its run.

A request of a run's round has the id `{run_id}.{round}.{i}`: the Lua steps that finish such a
request need its run's keys, and the caller finds the run here without a read (the step checks
the stored run id and asks again if it differs, so the format is a shortcut, not a trust).
"""

from __future__ import annotations

import os
import secrets
import time


def new_id(prefix: str) -> str:
    """A sortable, unguessable id: milliseconds since the epoch in hex, then 64 random bits."""
    return f"{prefix}_{int(time.time() * 1000):011x}{secrets.token_hex(8)}"


def new_ids(prefix: str, n: int) -> list[str]:
    """`n` ids as `new_id` makes them, for a bulk create: one clock read and one read of the
    system's random source for all of them (each id still has its own 64 random bits)."""
    head = f"{prefix}_{int(time.time() * 1000):011x}"
    rand = os.urandom(8 * n).hex()
    return [head + rand[i : i + 16] for i in range(0, 16 * n, 16)]


def round_request_id(run_id: str, round_no: int, index: int) -> str:
    """The id of the `index`-th pending call of one round of a run."""
    return f"{run_id}.{round_no}.{index}"


def run_of_request(request_id: str) -> str | None:
    """The run a request id names (see `round_request_id`), or None for a standalone one."""
    parts = request_id.rsplit(".", 2)
    if len(parts) == 3 and parts[0] and parts[1].isdigit() and parts[2].isdigit():
        return parts[0]
    return None
