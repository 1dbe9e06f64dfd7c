"""The cluster fleet test's checks: what must hold once the fleet drained after master kills.

The checks of outcomes and resumes are `tests/support/fleet_checks.py`'s, which read every partition
and take the Redis RQ keeps its jobs on (its own, on a cluster). Only the runs' section
is its own: there is no plan of role kills to hold the failed runs against (the test checks
its master kills itself).
"""

from __future__ import annotations

from collections import Counter

from redis import Redis

from broker.domain.models import Request, RunStatus
from broker.facade import Broker
from tests.support.fakes.deciding_receiver import DecidingReceiver
from tests.support.fleet_checks import (
    FAILED_RUN_REASONS,
    FINAL,
    Findings,
    Started,
    all_request_ids,
    check_outcomes,
    check_resumes,
    outbox_left,
)

__all__ = ["all_request_ids", "check", "outbox_left"]


def requests_of(broker: Broker, started: list[Started]) -> dict[str, Request]:
    return {r.id: r for r in broker.get_requests(all_request_ids(broker, started))}


def check(
    broker: Broker, rq: Redis, receiver: DecidingReceiver, started: list[Started]
) -> Findings:
    """Everything that must hold once the fleet drained; `found.problems` lists what didn't."""
    found = Findings()
    runs = {s.run_id: broker.get_run(s.run_id) for s in started}
    requests = requests_of(broker, started)
    by_run = {r.run_id: r for r in requests.values()}

    # every run final: finished, or failed for a listed reason
    found.counts["runs"] = {
        "started": len(started),
        **Counter(r.status.value for r in runs.values()),
    }
    found.bad(
        "runs neither finished nor failed",
        [
            f"{r.id} {r.status.value} round {r.round}"
            for r in runs.values()
            if r.status not in FINAL
        ],
    )
    found.bad(
        "failed runs whose reason is not listed (FAILED_RUN_REASONS)",
        [
            f"{r.id}: {(r.error or '(none)')[:160]}"
            for r in runs.values()
            if r.status is RunStatus.failed
            and not any(text in (r.error or "") for text in FAILED_RUN_REASONS.values())
        ],
    )
    found.bad(
        "finished runs that never asked for approval",
        [rid for rid, r in runs.items() if r.status is RunStatus.finished and rid not in by_run],
    )

    # one outcome per request: decided, one outcome event in its stream, one at the webhook
    found.counts["requests"] = {
        "total": len(requests),
        **Counter(r.status.value for r in requests.values()),
    }
    found.bad(
        "requests without an outcome",
        [f"{r.id} {r.status.value}" for r in requests.values() if r.is_pending or not r.decision],
    )
    check_outcomes(found, broker, requests, receiver)
    check_resumes(found, broker, rq, started, runs, by_run)
    return found
