"""Runs as stored: the run hash, its pending set and rounds, and its history (the run's log).

Starting a run on the fleet (enqueueing its job) is `broker.runs.starting`; this module only reads and
writes the records, and never enqueues. What a round starts from is read in one round trip
(`read_round`: the hash, the log and, for a resume, the round's requests); each step of a
round is one write (`queue_step`: the log entry of the messages it added, and the hash's fields
in the same MULTI), so a step never writes the history again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from broker.domain.errors import NotFound
from broker.domain.ids import new_id, round_request_id
from broker.domain.models import Request, Run, RunStatus, from_timestamp
from broker.redis.replies import as_bytes, as_fields, as_hash, as_str, as_str_dict
from broker.store.handles import Store
from broker.store.keys import Keys
from broker.store.request_hash import parse_request

ENDED = (RunStatus.finished.value, RunStatus.failed.value)
ANNOUNCED = (RunStatus.waiting.value, *ENDED)
"""Statuses a run's long-poll answers on, so each is announced on the run-events stream."""
RUN_EVENTS_MAXLEN = 10_000
"""About how many entries a partition's run-events stream keeps: a long-poll only needs the
entries written while it waits."""


def run_read(keys: Keys, run_id: str) -> list[tuple[str, tuple[str]]]:
    """The reads of a run (`run_from` reads their replies): its hash, then its pending set.
    The sync store queues them on a pipeline (`queue_run_read`), the API's asyncio reads send
    them with the rest of a pass of its loop (`broker.store.coalesced`)."""
    return [("hgetall", (keys.run(run_id),)), ("smembers", (keys.run_pending(run_id),))]


def queue_run_read(pipe: Any, keys: Keys, run_id: str) -> None:
    """Queue `run_read` on a pipeline."""
    for command, args in run_read(keys, run_id):
        getattr(pipe, command)(*args)


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


@dataclass
class RoundRead:
    """What a round of a run starts from, as `RunStore.read_round` read it."""

    fields: dict[str, str]
    """The run's hash, as text."""
    log: list[bytes]
    """The run's log: each entry a JSON array of the messages one step added."""
    legacy: bytes | None
    """The history of a run paused before the log existed (`Keys.run_messages`), else None."""
    requests: list[Request] | None
    """The round's requests, in call order (when asked for)."""


@dataclass(frozen=True)
class RoundClaim:
    """A claim of a round that must be complete first (`RunStore.claim_round`)."""

    state: Literal["mine", "pending", "other"]
    """mine: claimed by the caller (now or before); pending: a call still waits for its
    outcome, nothing was written; other: someone else's round, or the run is gone."""
    read: RoundRead | None
    """What the claimant goes on with (the run's hash, the round's requests) when it is mine."""


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

    def read_round(self, run_id: str, round_no: int, *, requests: bool = False) -> RoundRead:
        """The run's hash and log, and with `requests` the requests of its round `round_no`,
        in one round trip: the first request of the round (`{run}.{round}.0`) is read with
        them, so a round of one call costs no second one. NotFound for an unknown run."""
        keys = self.store.keys
        pipe = self.store.redis.pipeline(transaction=False)
        pipe.hgetall(keys.run(run_id))
        pipe.lrange(keys.run_log(run_id), 0, -1)
        pipe.get(keys.run_messages(run_id))
        if requests:
            self._queue_round(pipe, run_id, round_no)
        raw, log, legacy, *more = pipe.execute()
        if not raw:
            raise NotFound(f"no run with id {run_id!r}")
        got = self._round(run_id, round_no, *more) if requests else None
        return RoundRead(as_str_dict(raw), list(log), legacy, got)

    def claim_round(self, run_id: str, round_no: int, field: str, who: str) -> RoundClaim:
        """Claim round `round_no` for `who` (`HSETNX field who`) if all its calls have an
        outcome, and read the run's hash and the round's requests, in one step (`claim.lua`).
        The log is not read: the claimant has the history already."""
        keys = self.store.keys
        reply = self.store.scripts.run_flat(
            "claim",
            [
                keys.run(run_id),
                keys.run_pending(run_id),
                keys.run_round(run_id, round_no),
                keys.request(round_request_id(run_id, round_no, 0)),
            ],
            [field, who],
        )
        state = reply[0]
        if state != "mine":
            return RoundClaim(state, None)
        _, run, ids, first = reply
        requests = self._round(run_id, round_no, ids, as_hash(first))
        return RoundClaim("mine", RoundRead(as_str_dict(as_hash(run)), [], None, requests))

    def _queue_round(self, pipe: Any, run_id: str, round_no: int) -> None:
        """Queue the reads of round `round_no`'s requests: their ids and the first request
        (`{run}.{round}.0`), so a round of one call costs no second round trip (`_round`)."""
        keys = self.store.keys
        pipe.lrange(keys.run_round(run_id, round_no), 0, -1)
        pipe.hgetall(keys.request(round_request_id(run_id, round_no, 0)))

    def _round(self, run_id: str, round_no: int, ids: list[Any], first: Any) -> list[Request]:
        """The round's requests from `_queue_round`'s replies (the others read now, if any)."""
        names = [as_str(i) for i in ids]
        if names == [round_request_id(run_id, round_no, 0)] and first:
            return [parse_request(first)]
        return self._requests(names)

    def _requests(self, ids: list[str]) -> list[Request]:
        pipe = self.store.redis.pipeline(transaction=False)
        for rid in ids:
            pipe.hgetall(self.store.keys.request(rid))
        return [parse_request(raw) for raw in pipe.execute() if raw]

    def queue_step(
        self,
        pipe: Any,
        run_id: str,
        fields: Mapping[str, str | int],
        *,
        entry: bytes | None = None,
        after: int = 0,
    ) -> None:
        """Queue on `pipe` (a MULTI, sync or asyncio) one step of a round: `fields` into the
        run's hash (its stage, status, counts; `updated_at` too) and, when the step added
        messages, their log `entry` after the log's first `after` entries (what the log held
        before it, so a step taken again writes the same log).

        Its first reply is the log's length before the step: shorter than `after` only when
        Redis lost writes it had acknowledged (a master that failed over before its replica had
        them), and then the caller writes the log again whole."""
        keys = self.store.keys
        log = keys.run_log(run_id)
        pipe.llen(log)
        if entry is not None:
            if after:
                pipe.ltrim(log, 0, after - 1)
            else:
                pipe.delete(log)
            pipe.rpush(log, entry)
        pipe.hset(keys.run(run_id), mapping={**fields, "updated_at": f"{time.time():.6f}"})

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
        pipe = self.store.redis.pipeline()
        self.queue_update(pipe, run_id, rounds=rounds, **fields)
        pipe.execute()

    def queue_update(self, pipe: Any, run_id: str, *, rounds: int | None, **fields: Any) -> None:
        """Queue `update_run`'s writes on a MULTI, sync or asyncio (an asyncio one must be
        given `rounds` for a run that ends: nothing is read here then)."""
        mapping: dict[str, str] = {
            k: (v.value if isinstance(v, RunStatus) else v) for k, v in fields.items()
        }
        mapping["updated_at"] = f"{time.time():.6f}"
        pipe.hset(self.store.keys.run(run_id), mapping=as_fields(mapping))
        if mapping.get("status") in ENDED:
            self.expire_run(pipe, run_id, rounds)
        self.announce(pipe, run_id, mapping.get("status"))

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
        names = [keys.run(run_id), keys.run_pending(run_id), keys.run_log(run_id)]
        names.append(keys.run_messages(run_id))
        names += [keys.run_round(run_id, n) for n in range(rounds + 1)]
        for key in names:
            pipe.expire(key, self.store.retention)

    def save_messages(self, run_id: str, messages_json: bytes) -> None:
        """Keep a history the way runs paused before the log did (tests of the upgrade)."""
        self.store.redis.set(self.store.keys.run_messages(run_id), messages_json)

    def load_messages(self, run_id: str) -> bytes | None:
        """The run's history as one JSON array of messages (its log's entries joined), or
        what a run paused before the log kept (None: neither)."""
        log = [as_bytes(e) for e in self.store.redis.lrange(self.store.keys.run_log(run_id), 0, -1)]
        if not log:
            return as_bytes(self.store.redis.get(self.store.keys.run_messages(run_id)))
        return b"[" + b",".join(e[1:-1] for e in log if len(e) > 2) + b"]"
