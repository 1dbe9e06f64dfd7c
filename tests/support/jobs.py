"""Agent jobs run in the test's own process: RQ's SimpleWorker, bound to the test's broker."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager

from rq import SimpleWorker
from rq.serializers import JSONSerializer

from broker.facade import Broker
from broker.runs import agent_jobs as jobs
from broker.runs.starting import run_queue


@contextmanager
def jobs_bound_to(broker: Broker) -> Iterator[Broker]:
    """Run RQ jobs in this process against `broker`; restore the signal handlers RQ replaces."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    jobs.bind(broker)
    try:
        yield broker
    finally:
        jobs.bind(None)
        for s, handler in handlers.items():
            signal.signal(s, handler)


def work(broker: Broker) -> None:
    """Run every queued agent job in this process (RQ's SimpleWorker, burst mode)."""
    SimpleWorker(
        [run_queue(broker)], connection=broker.store.rq_redis, serializer=JSONSerializer
    ).work(burst=True, logging_level="WARNING")
