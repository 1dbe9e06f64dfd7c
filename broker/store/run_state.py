"""Runs as stored: the run hash, its pending set and rounds, and its message checkpoints.

Starting a run on the fleet (enqueueing its job) is `broker.runs.starting`; this module only reads and
writes the records, and never enqueues.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import Any

from broker.domain.errors import NotFound
from broker.domain.ids import new_id
from broker.domain.models import Run, RunStatus, from_timestamp
from broker.redis.replies import as_bytes, as_fields, as_str, as_str_dict
from broker.store.handles import Store
from broker.store.keys import Keys

ENDED = (RunStatus.finished.value, RunStatus.failed.value)
ANNOUNCED = (RunStatus.waiting.value, *ENDED)
"""Statuses a run's long-poll answers on, so each is announced on the run-events stream."""
RUN_EVENTS_MAXLEN = 10_000
"""About how many entries a partition's run-events stream keeps: a long-poll only needs the
entries written while it waits."""


def queue_run_read(pipe: Any, keys: Keys, run_id: str) -> None:
    """Queue the reads of a run on a pipeline, sync or asyncio (`run_from` reads the replies):
    its hash, then its pending set. The sync store and the API's asyncio reads share it."""
    pipe.hgetall(keys.run(run_id))
    pipe.smembers(keys.run_pending(run_id))


def run_from(run_id: str, f: dict[str, str], members: Iterable[Any]) -> Run:
    """A run from its hash (as text) and its pending set as Redis returned it (the sync store
    and the API's asyncio reads share it); NotFound for an empty hash."""
    if not f:
        raise NotFound(f"no run with id {run_id!r}")
    return Run(
        id=f["id"],
        agent=f["agent"],
        status=RunStatus(f["status"]),
        round=int(f.get("round", 0)),
        pending=sorted(as_str(x) for x in members),
        output=json.loads(f["output"]) if f.get("output") else None,
        error=f.get("error") or None,
        created_at=from_timestamp(float(f["created_at"])),
        updated_at=from_timestamp(float(f["updated_at"])),
    )


class RunStore:
    def __init__(self, store: Store) -> None:
        self.store = store

    def create_run(
        self,
        agent: str,
        prompt: str,
        *,
        run_id: str | None = None,
        extra: dict[str, str] | None = None,
    ) -> Run:
        """Store a new `queued` run (without enqueueing it: see `broker.runs.starting.start_run`)."""
        fields = self.new_run_fields(agent, prompt, run_id=run_id, extra=extra)
        self.store.redis.hset(self.store.keys.run(fields["id"]), mapping=as_fields(fields))
        return self.get_run(fields["id"])

    def new_run_fields(
        self,
        agent: str,
        prompt: str,
        *,
        run_id: str | None = None,
        extra: dict[str, str] | None = None,
    ) -> dict[str, str]:
        """The hash of a new `queued` run, for callers that store it in a transaction."""
        now = f"{time.time():.6f}"
        return {
            "id": run_id or new_id("run"),
            "agent": agent,
            "prompt": prompt,
            "status": RunStatus.queued.value,
            "round": "0",
            "created_at": now,
            "updated_at": now,
            **(extra or {}),
        }

    def run_fields(self, run_id: str) -> dict[str, str]:
        raw = self.store.redis.hgetall(self.store.keys.run(run_id))
        if not raw:
            raise NotFound(f"no run with id {run_id!r}")
        return as_str_dict(raw)

    def run_field(self, run_id: str, name: str) -> str | None:
        """One field of a run's hash; None when the run or the field is not there."""
        return as_str(self.store.redis.hget(self.store.keys.run(run_id), name))

    def run_state(self, run_id: str) -> tuple[dict[str, str], bytes | None]:
        """The run's fields and its stored history in one round trip (what a round starts
        from); NotFound for an unknown run."""
        pipe = self.store.redis.pipeline(transaction=False)
        pipe.hgetall(self.store.keys.run(run_id))
        pipe.get(self.store.keys.run_messages(run_id))
        raw, messages = pipe.execute()
        if not raw:
            raise NotFound(f"no run with id {run_id!r}")
        return as_str_dict(raw), messages

    def get_run(self, run_id: str) -> Run:
        """The run, its hash and pending set read in one round trip."""
        pipe = self.store.redis.pipeline(transaction=False)
        queue_run_read(pipe, self.store.keys, run_id)
        raw, members = pipe.execute()
        return run_from(run_id, as_str_dict(raw), members)

    def update_run(self, run_id: str, *, rounds: int | None = None, **fields: Any) -> None:
        """Set run fields (status, output as JSON, error, ...) and touch `updated_at`.

        A run that ends (finished or failed) is kept `retention_s`, like a decided request;
        `rounds` (its current round, when the caller knows it) saves reading it for that.
        """
        mapping: dict[str, str] = {
            k: (v.value if isinstance(v, RunStatus) else v) for k, v in fields.items()
        }
        mapping["updated_at"] = f"{time.time():.6f}"
        pipe = self.store.redis.pipeline()
        pipe.hset(self.store.keys.run(run_id), mapping=as_fields(mapping))
        if mapping.get("status") in ENDED:
            self.expire_run(pipe, run_id, rounds)
        self.announce(pipe, run_id, mapping.get("status"))
        pipe.execute()

    def announce(self, pipe: Any, run_id: str, status: str | None) -> None:
        """Queue on `pipe` (after the status write) the entry that wakes the long-polls on
        `run_id`, when `status` is one they answer on; nothing for other statuses."""
        if status in ANNOUNCED:
            pipe.xadd(
                self.store.keys.run_events_of(run_id),
                {"run_id": run_id, "status": status},
                maxlen=RUN_EVENTS_MAXLEN,
                approximate=True,
            )

    def expire_run(self, pipe: Any, run_id: str, rounds: int | None = None) -> None:
        """Queue on `pipe` the expiry of every key of an ended run (after `retention_s`);
        `rounds`: its current round (read here when not given)."""
        keys = self.store.keys
        if rounds is None:
            rounds = int(self.store.redis.hget(keys.run(run_id), "round") or 0)
        names = [keys.run(run_id), keys.run_pending(run_id), keys.run_messages(run_id)]
        names += [keys.run_round(run_id, n) for n in range(rounds + 1)]
        for key in names:
            pipe.expire(key, self.store.retention)

    def save_messages(self, run_id: str, messages_json: bytes) -> None:
        """Checkpoint the run's message history (what a resume starts from)."""
        self.store.redis.set(self.store.keys.run_messages(run_id), messages_json)

    def load_messages(self, run_id: str) -> bytes | None:
        return as_bytes(self.store.redis.get(self.store.keys.run_messages(run_id)))
