"""The outbox of fully answered rounds, and the step that turns each entry into one resume job.

Each entry is read through the consumer group `resumers`, its resume job is enqueued under the
deterministic id `resume-{run_id}-{round}` (RQ refuses a second one), and only then is the entry
acknowledged. A resumer that dies after reading leaves the entry pending; another one (or the
same one restarted) claims it once it has been idle for `min_idle_ms`, and enqueueing it again
is a no-op, so a crash between any two steps neither loses nor doubles a resume.

The `approval-broker resumer` role (workers/resumer.py) runs this in a loop; `broker.testing`
runs it in-process.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from dataclasses import dataclass
from typing import Any

from broker.client import Broker
from broker.keys import RESUMER_GROUP
from broker.runs import enqueue_resume

log = logging.getLogger("broker.outbox")


def default_consumer() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class Handled:
    entry_id: str
    run_id: str | None
    round: int | None
    action: str  # "enqueued" | "duplicate" | "dead-lettered"


class Resumer:
    """Reads the outbox through a consumer group and enqueues one resume job per round."""

    def __init__(
        self,
        broker: Broker,
        *,
        consumer: str | None = None,
        min_idle_ms: int = 30_000,
        block_ms: int | None = 1000,
        count: int = 100,
    ) -> None:
        self.broker = broker
        self.consumer = consumer or default_consumer()
        self.min_idle_ms = min_idle_ms
        self.block_ms = block_ms
        self.count = count
        self.stream = broker.keys.resumes

    def read(self) -> list[tuple[str, dict[str, str]]]:
        """Entries a dead resumer left behind first, then new ones (waits up to `block_ms`)."""
        redis = self.broker.redis
        self.broker.ensure_group(self.stream, RESUMER_GROUP)
        claimed = redis.xautoclaim(
            self.stream, RESUMER_GROUP, self.consumer, self.min_idle_ms, "0-0", count=self.count
        )
        entries: list[Any] = list(claimed[1])  # Redis 6.2 returns 2 items, 7.x returns 3
        if not entries:
            got = redis.xreadgroup(
                RESUMER_GROUP,
                self.consumer,
                {self.stream: ">"},
                count=self.count,
                block=self.block_ms,
            )
            entries = list(got[0][1]) if got else []
        out: list[tuple[str, dict[str, str]]] = []
        for eid, f in entries:
            if f is None:  # deleted from the stream while pending: nothing to resume
                self.ack(_s(eid))
            else:
                out.append((_s(eid), {_s(k): _s(v) for k, v in f.items()}))
        return out

    def handle(self, entry_id: str, fields: dict[str, str]) -> Handled:
        """Enqueue the resume of one entry, then acknowledge it."""
        run_id = fields.get("run_id")
        raw_round = fields.get("round", "")
        if not run_id or not raw_round.isdigit():
            self.broker.dead_letter(
                "resumer",
                f"malformed outbox entry (needs run_id and a round number): {fields!r}",
                stream=self.stream,
                entry=fields,
            )
            self.ack(entry_id)
            return Handled(entry_id, run_id, None, "dead-lettered")
        round_no = int(raw_round)
        if not self.broker.redis.exists(self.broker.keys.run(run_id)):
            self.broker.dead_letter(
                "resumer", f"run {run_id} does not exist", stream=self.stream, entry=fields
            )
            self.ack(entry_id)
            return Handled(entry_id, run_id, round_no, "dead-lettered")
        fresh = enqueue_resume(self.broker, run_id, round_no)
        self.ack(entry_id)
        action = "enqueued" if fresh else "duplicate"
        log.info("run %s round %s: resume %s", run_id, round_no, action)
        return Handled(entry_id, run_id, round_no, action)

    def ack(self, entry_id: str) -> None:
        self.broker.ack_resume(entry_id)

    def run_once(self) -> list[Handled]:
        return [self.handle(entry_id, fields) for entry_id, fields in self.read()]

    def run_forever(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.run_once()
            except Exception:  # noqa: BLE001 - a Redis hiccup must not end the loop
                log.exception("resumer: reading the outbox failed; retrying")
                stop.wait(1.0)


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
