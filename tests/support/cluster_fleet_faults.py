"""The cluster fleet test's app and faults: starting runs, following them, killing masters.

The app starts runs of the demo refunds agent (one customer each) through a cluster client,
keeping a bounded number unfinished; the faults thread SIGKILLs a master of the cluster when a
given share of the runs has started, waits for its replica's promotion, and starts the killed
node again (it comes back as the new master's replica, as an orchestrator would restart a pod).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from redis.exceptions import RedisError
from refunds_demo import AGENT_NAME

from broker.domain.models import RunStatus
from broker.facade import Broker
from broker.redis.local_cluster import LocalCluster
from broker.runs.starting import start_run
from tests.support.fleet_checks import FINAL, Started


@dataclass
class Kill:
    """One master SIGKILLed: who, when, and how long the promotion and the rejoin took."""

    node: int
    at_run: int
    promoted: int = -1
    promotion_s: float = 0.0
    rejoin_s: float = 0.0


@dataclass
class Faults:
    kills: list[Kill] = field(default_factory=list)
    start_errors: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def poll_until(predicate: Callable[[], object], timeout: float, what: str, halt: threading.Event) -> bool:  # fmt: skip
    """Poll `predicate` until true; False if `halt` was set first; AssertionError at the deadline."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if halt.is_set():
            return False
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout:.0f} s")
        time.sleep(0.1)
    return True


class Tracker:
    """Which started runs are not final yet (polled in one pipeline over the cluster)."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.open: set[str] = set()
        self.lock = threading.Lock()

    def add(self, run_id: str) -> None:
        with self.lock:
            self.open.add(run_id)

    def poll(self) -> int:
        """How many are still open (as last seen, if the cluster does not answer right now)."""
        with self.lock:
            ids = list(self.open)
        if ids:
            try:
                pipe = self.broker.redis.pipeline(transaction=False)
                for rid in ids:
                    pipe.hget(self.broker.keys.run(rid), "status")
                statuses = pipe.execute()
            except RedisError:
                statuses = [None] * len(ids)
            done = {
                rid
                for rid, status in zip(ids, statuses, strict=True)
                if status is not None and RunStatus(status.decode()) in FINAL
            }
            with self.lock:
                self.open -= done
        with self.lock:
            return len(self.open)


def prompt_for(i: int) -> str:
    """Above the demo's $50 auto-refund limit, at most $150 (one approver decides)."""
    return f"Refund ${61 + (i * 7) % 89} on order A103 because the tent floor tore (case {i})."


def drive(
    broker: Broker,
    tracker: Tracker,
    started: list[Started],
    faults: Faults,
    n: int,
    inflight: int,
    halt: threading.Event,
) -> None:
    """Start `n` runs, at most `inflight` unfinished at a time; a refused start is retried."""
    i = 0
    while i < n and not halt.is_set():
        while tracker.poll() >= inflight and not halt.is_set():
            time.sleep(0.1)
        customer = f"c{i:05d}"
        try:
            run = start_run(broker, AGENT_NAME, prompt_for(i), deps={"customer": customer})
        except RedisError as exc:  # the app retries (a new run); counted
            faults.start_errors.append(f"run {i}: {type(exc).__name__}: {exc}")
            time.sleep(0.1)
            continue
        started.append(Started(i, run.id, customer, 0))
        tracker.add(run.id)
        i += 1


def kill_masters(
    cluster: LocalCluster,
    started: list[Started],
    at_runs: list[int],
    faults: Faults,
    halt: threading.Event,
) -> None:
    """At each of `at_runs` runs started, SIGKILL a master (first one of the original three, then
    the replica that took over from it), time its replica's promotion, then start the killed
    node again and wait for it to rejoin as a replica."""
    try:
        for at in at_runs:
            if not poll_until(lambda at=at: len(started) >= at, 300, f"{at} runs started", halt):
                return
            # the node that took over last time, now master of the same slots with the killed
            # node back as its replica: the same shard fails over twice
            last = faults.kills[-1].promoted if faults.kills else None
            masters = cluster.masters()
            victim = last if last in masters and cluster.replicas_of(last) else masters[0]
            kill = Kill(victim, len(started))
            t0 = time.monotonic()
            kill.promoted = cluster.kill_master(victim, timeout=60)
            kill.promotion_s = time.monotonic() - t0
            t1 = time.monotonic()
            cluster.restart(victim, timeout=60)
            kill.rejoin_s = time.monotonic() - t1
            faults.kills.append(kill)
    except Exception as exc:  # reported by the test, which fails on it
        faults.errors.append(f"{type(exc).__name__}: {exc}")
        for i, node in enumerate(cluster.nodes):  # the rest of the run still gets a cluster
            if not node.alive:
                cluster.restart(i, timeout=60)
