"""The sweeper: turns silence into an outcome, and seals the audit trail.

Due requests are found through the expiry ZSET in batches (cost grows with what is due, not with
what is pending). Each batch is one atomic Lua step, so any number of sweepers can run at once
without handling a request twice. A thread of its own seals the audit trail about once a second
(`SEAL_EVERY_S`: hashes the entries appended since, `broker.audit.sealing`, off Redis's thread
and safe with many sweepers), so a backlog of entries to hash never makes a sweep late. A
failed sweep or seal (Redis restarting, say) is logged and tried again after a pause; only
`stop` (SIGTERM/SIGINT for the role) ends the loops.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable

from broker.audit.sealing import SEAL_EVERY_S
from broker.domain.config import Config
from broker.domain.settings import Settings
from broker.facade import Broker, SweepResult
from broker.tracing import spans as traced
from broker.tracing import telemetry as tracing

log = logging.getLogger("workers.sweeper")

BATCH = 200
ERROR_PAUSE_S = 1.0
"""How long the loop waits after a failed sweep before trying again."""


def sweep_due(broker: Broker, *, now: float | None = None, batch: int = BATCH) -> list[SweepResult]:
    """Handle everything due at `now`, batch after batch, and return what was done."""
    done: list[SweepResult] = []
    while True:
        started = tracing.now_ns()
        swept = broker.sweeping.sweep_batch(now=now, limit=batch)
        traced.swept(broker, swept.results, started)  # when tracing is on: a span each
        done.extend(swept.results)
        if swept.listed < batch:  # not `results`: another sweeper may have taken some
            return done


def next_due_in(broker: Broker) -> float | None:
    """Seconds until the earliest pending request expires (negative if overdue), or None.

    On Redis's clock, like the sweep: a host whose clock is off still wakes on time."""
    return broker.sweeping.next_due_in()


def sweep_forever(
    broker: Broker,
    stop: threading.Event,
    *,
    interval: float = 0.25,
    report: Callable[[list[SweepResult]], None] | None = None,
    batch: int = BATCH,
    error_pause: float = ERROR_PAUSE_S,
) -> None:
    """Sweep until `stop` is set, waking at the next expiry or every `interval` seconds; while
    the audit trail is on, `seal_forever` runs beside it in a thread of its own."""
    sealer = None
    if broker.audit.enabled:
        sealer = threading.Thread(
            target=seal_forever, args=(broker, stop), name="audit-sealer", daemon=True
        )
        sealer.start()
    try:
        while not stop.is_set():
            try:
                results = sweep_due(broker, batch=batch)
                if results and report:
                    report(results)
                wait = next_due_in(broker)
            except Exception:  # noqa: BLE001 - a Redis hiccup must not end the loop
                log.exception("sweeper: sweeping failed; trying again in %ss", error_pause)
                stop.wait(error_pause)
                continue
            stop.wait(interval if wait is None else min(interval, max(wait, 0.0)))
    finally:
        if sealer is not None:
            sealer.join(timeout=30)


def seal_forever(
    broker: Broker,
    stop: threading.Event,
    *,
    every: float = SEAL_EVERY_S,
    error_pause: float = ERROR_PAUSE_S,
) -> None:
    """Seal every audit chain until `stop` is set, every `every` seconds (each time through to
    the chains' ends: a backlog, say after a bulk create, is sealed in one go)."""
    trail = broker.audit
    while not stop.is_set():
        try:
            trail.seal()
        except Exception:  # noqa: BLE001 - a Redis hiccup must not end the loop
            log.exception(
                "sweeper: sealing the audit trail failed; trying again in %ss", error_pause
            )
            stop.wait(error_pause)
            continue
        stop.wait(every)


def run_sweeper(
    settings: Settings,
    config: Config,
    *,
    interval: float = 0.25,
    stop: threading.Event | None = None,
) -> None:
    """The `approval-broker sweeper` role: runs until SIGTERM or SIGINT (or `stop` is set)."""
    broker = Broker.from_settings(settings, config, patient=True)
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def report(results: list[SweepResult]) -> None:
        escalated = sum(r.action == "escalated" for r in results)
        print(f"sweeper: escalated {escalated}, timed out {len(results) - escalated}", flush=True)

    print(f"sweeper watching {len(config.queues)} queue(s) every {interval}s at most", flush=True)
    try:
        sweep_forever(broker, stop, interval=interval, report=report)
    except KeyboardInterrupt:
        stop.set()
