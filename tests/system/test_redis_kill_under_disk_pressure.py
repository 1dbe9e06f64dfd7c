"""Guarantee 4 on a busy disk: every create Redis acknowledged is there after Redis is SIGKILLed.

With `appendfsync everysec` Redis fsyncs its AOF in a background thread about once a second,
and while one of those fsyncs still runs it keeps the AOF writes of newer commands in memory
(for up to 2 s) and answers them all the same: a SIGKILL then loses writes it acknowledged. A
busy disk makes those fsyncs slow. So here a writer process hammers the same disk (1 MiB writes,
each followed by an fsync), CREATORS threads create requests with large args at once, and Redis
is SIGKILLed at the worst moment it lets us see: `INFO persistence` shows a background fsync in
flight, a create sent after that look is acknowledged, and a second look shows the fsync still
running (everysec); or once MAX_CREATES are acknowledged, if it never runs one (with `always`
Redis fsyncs before it answers, never behind).
After a restart on the same data dir, every request id a create call returned must be there.

The embedded Redis's default is what is tested. APPROVAL_BROKER_TEST_FSYNC=everysec runs the
same test on the policy it replaced: on a machine whose disk takes a moment to fsync, it loses
acknowledged creates and fails (docs: Deployment, "Durability").
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from redis import Redis
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

from broker.domain.models import NewRequest
from broker.facade import Broker
from broker.redis.connection import connect
from broker.redis.embedded import EmbeddedRedis

CREATORS = 8
ARGS_BYTES = 32 * 1024
MIN_CREATES = 200
"""Acknowledged creates before a kill may come: enough that the AOF has grown under pressure."""
MAX_CREATES = 3000
DEADLINE_S = 180.0
WRITER = """
import os, sys
path, block = sys.argv[1], os.urandom(1 << 20)
fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
offset = 0
while True:
    os.pwrite(fd, block, offset)
    os.fsync(fd)
    offset = (offset + len(block)) % (256 << 20)
    os.write(1, b".")
"""
"""Rewrites a 256 MiB file in 1 MiB blocks, fsyncing each, and says so after each (a dot)."""


def hammer_disk(folder: Path) -> subprocess.Popen[bytes]:
    """The writer process, once it has written and fsynced its first block."""
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(folder / "pressure.bin")], stdout=subprocess.PIPE
    )
    assert writer.stdout is not None and writer.stdout.read(1) == b"."
    return writer


def creator_client(url: str) -> Redis:
    """A client that waits out a slow fsync (a busy disk) and never sends a command again: a
    create it gets no answer to is not acknowledged, and not counted."""
    return Redis.from_url(
        url, socket_connect_timeout=5, socket_timeout=60, retry=Retry(NoBackoff(), 0)
    )


@dataclass
class Creates:
    """The creates Redis acknowledged, and the send ticket of each: a ticket is taken just
    before its create is sent, so a create acknowledged with a ticket above one taken after a
    look at Redis was run by Redis after that look."""

    ids: list[str] = field(default_factory=list)
    tickets: Iterator[int] = field(default_factory=itertools.count)
    last_acked: int = -1
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def acked(self, ticket: int, request_id: str) -> None:
        with self.lock:
            self.ids.append(request_id)
            self.last_acked = max(self.last_acked, ticket)


def create_until_stopped(broker: Broker, creates: Creates, stop: threading.Event, n: int) -> None:
    """Create requests with large args until `stop`, or until Redis stops answering; record the
    id of each create Redis acknowledged."""
    blob = (f"creator {n} " * (ARGS_BYTES // 10))[:ARGS_BYTES]
    i = 0
    while not stop.is_set():
        ticket = next(creates.tickets)
        try:
            request = broker.create_request(
                NewRequest(tool_name="store", args={"blob": blob, "creator": n, "i": i})
            )
        except RedisError as exc:
            creates.errors.append(type(exc).__name__)
            return
        creates.acked(ticket, request.id)
        i += 1


def fsync_running(watcher: Redis) -> bool:
    """Redis says a background fsync of its AOF is in flight (everysec's, never always')."""
    return bool(watcher.info("persistence").get("aof_pending_bio_fsync"))


def kill_at_the_worst_moment(server: EmbeddedRedis, creates: Creates) -> str:
    """SIGKILL Redis once a create sent after a background AOF fsync was seen running is
    acknowledged and the fsync still runs (or after MAX_CREATES); returns what triggered it."""
    watcher = connect(server.url)
    deadline = time.monotonic() + DEADLINE_S
    try:
        while True:
            done = len(creates.ids)
            assert time.monotonic() < deadline, f"only {done} creates in {DEADLINE_S:.0f} s"
            if done >= MAX_CREATES:
                reason = f"{done} creates acknowledged"
                break
            if done >= MIN_CREATES and fsync_running(watcher):
                seen = next(creates.tickets)  # creates sent from now on ran during the fsync
                while creates.last_acked < seen and not creates.errors:
                    assert time.monotonic() < deadline, "no create acknowledged in time"
                if fsync_running(watcher):  # and it still runs: kill now
                    reason = "a create acknowledged during a background fsync"
                    break
        server.kill()
        return reason
    finally:
        watcher.close()


def test_every_acknowledged_create_survives_a_redis_sigkill_under_disk_pressure(
    tmp_path: Path,
) -> None:
    chosen = os.environ.get("APPROVAL_BROKER_TEST_FSYNC")
    server = (
        EmbeddedRedis(tmp_path / "redis", fsync=chosen)  # type: ignore[arg-type]
        if chosen
        else EmbeddedRedis(tmp_path / "redis")
    ).start()
    writer = hammer_disk(tmp_path)
    creates = Creates()
    stop = threading.Event()
    clients = [creator_client(server.url) for _ in range(CREATORS)]
    creators = [
        threading.Thread(
            target=create_until_stopped, args=(Broker(c), creates, stop, n), daemon=True
        )
        for n, c in enumerate(clients)
    ]
    try:
        for t in creators:
            t.start()
        trigger = kill_at_the_worst_moment(server, creates)
        stop.set()
        for t in creators:
            t.join(30)
        assert not any(t.is_alive() for t in creators)
        assert writer.poll() is None, "the disk writer stopped before the kill"
        writer.kill()
        writer.wait()

        server.start()
        client = connect(server.url)
        broker = Broker(client)
        acked = list(creates.ids)
        found = broker.get_requests(acked)
        lost = sorted(set(acked) - {r.id for r in found})
        client.close()
        print(f"\n{len(acked)} creates acknowledged, killed after {trigger}; lost {len(lost)}")
        assert lost == [], f"{len(lost)} of {len(acked)} acknowledged creates lost ({trigger})"
        assert len(acked) >= MIN_CREATES
    finally:
        stop.set()
        if writer.poll() is None:
            writer.kill()
            writer.wait()
        for c in clients:
            c.close()
        server.close()
