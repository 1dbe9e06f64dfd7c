"""The cluster fleet test's checks: what must hold once the fleet drained after master kills.

`tests/fleet_checks.py` reads one Redis; on a cluster the broker's streams and outbox are split
into partitions and RQ's jobs live on RQ's own Redis, so these checks walk every partition and
ask RQ's Redis about jobs. The judging of one outcome against the receiver's intent is
`fleet_checks.judge`, reused as is.
"""

from __future__ import annotations

from collections import Counter

from redis import Redis
from rq.job import Job

from broker.client import Broker
from broker.keys import RESUMER_GROUP
from broker.models import Request, RunStatus, Status
from broker.runs import resume_job_id
from tests.fakes.deciding_receiver import DecidingReceiver
from tests.fleet_checks import (
    FAILED_RUN_REASONS,
    FINAL,
    LATE,
    REJECT_REASON,
    Findings,
    Started,
    all_request_ids,
    group_pending,
    judge,
)
from workers.demo import Ledger

OUTCOMES = ("approval.decided", "approval.timed_out")


def outcome_events(broker: Broker, queue: str = "default") -> Counter[str]:
    """Outcome events (decided or timed out) per request id, over every partition's stream."""
    counts: Counter[str] = Counter()
    for part in broker.keys.parts():
        for _, fields in broker.redis.xrange(part.stream(queue), "-", "+"):
            if fields.get(b"type", b"").decode() in OUTCOMES:
                counts[fields[b"request_id"].decode()] += 1
    return counts


def outbox_left(broker: Broker) -> tuple[int, int]:
    """(entries, entries handed out and not acknowledged) over every partition's outbox."""
    entries = pending = 0
    for part in broker.keys.parts():
        entries += int(broker.redis.xlen(part.resumes))
        pending += group_pending(broker.redis, part.resumes, RESUMER_GROUP)  # type: ignore[arg-type]
    return entries, pending


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
    events = outcome_events(broker)
    found.bad(
        "requests without exactly one outcome event in their stream",
        [f"{rid} x{events[rid]}" for rid in requests if events[rid] != 1],
    )
    found.bad(
        "requests whose outcome reached the webhook as other than one event",
        [
            f"{rid} x{len(receiver.outcomes.get(rid, ()))}"
            for rid in requests
            if len(receiver.outcomes.get(rid, ())) != 1
        ],  # fmt: skip
    )

    # what the receiver meant (and the API acknowledged) is what was recorded
    found.bad("requests that never reached the webhook", [r for r in requests if r not in receiver.intents])  # fmt: skip
    verdicts: Counter[str] = Counter()
    mismatched = []
    acknowledged = 0
    for rid, request in requests.items():
        intent = receiver.intents.get(rid)
        if intent is None or request.is_pending:
            continue
        answered = receiver.answered.get(rid)
        acknowledged += answered is not None and answered.status == 200
        problem = judge(request, intent, answered)
        if problem is None:
            verdicts[f"{intent.action} -> {request.status.value}"] += 1
        elif problem in LATE:
            verdicts[f"{intent.action} -> timed_out ({problem})"] += 1
        else:
            mismatched.append(f"{rid}: {problem}")
    found.bad("requests whose outcome is not what the receiver meant (or was told)", mismatched)
    found.bad("replies the API refused", receiver.failures)
    found.counts["webhook"] = {
        **receiver.stats(),
        "replies acknowledged (HTTP 200), each the recorded outcome": acknowledged,
        "meant -> outcome": dict(sorted(verdicts.items())),
    }

    # a resume job (its id is deterministic, so RQ holds one) per answered round; every tool
    # step of a finished run ran once, which is what a doubled resume would break
    once, resumes, twice, wrong = 0, [], [], []
    for s in started:
        run, request = runs[s.run_id], by_run.get(s.run_id)
        if request is None or request.is_pending:
            continue
        if not Job.exists(resume_job_id(s.run_id, 1), connection=rq):
            resumes.append(f"{s.run_id}: no resume job for its answered round 1")
        if Job.exists(resume_job_id(s.run_id, 2), connection=rq):
            resumes.append(f"{s.run_id}: a resume job for a round 2 it never had")
        ledger = Ledger(broker.redis, broker.keys.prefix, s.customer)
        attempts = ledger.attempts(request.tool_call_id)
        approved = request.status is Status.approved
        finished = run.status is RunStatus.finished
        if attempts > 1 or (attempts and not approved) or (approved and finished and not attempts):
            twice.append(f"{s.run_id} {request.status.value} {run.status.value}: {attempts}x")
        elif attempts == 1:
            once += 1
        if finished:
            output = run.output if isinstance(run.output, dict) else {}
            refunds = ledger.all()
            ok = {
                Status.approved: output.get("refunded") is True and len(refunds) == 1,
                Status.rejected: output.get("refunded") is False
                and REJECT_REASON in str(output.get("message"))
                and not refunds,
            }.get(request.status, output.get("refunded") is False and not refunds)
            if not ok:
                wrong.append(f"{s.run_id} {request.status.value}: {output} refunds={refunds}")
    found.bad(
        "answered rounds without their resume job (one id per round), or with a round 2", resumes
    )
    found.bad("tool steps that ran other than once per approved call (attempts)", twice)
    found.bad("runs whose output disagrees with their decision", wrong)
    entries, pending = outbox_left(broker)
    if entries or pending:
        found.problems.append(f"the outbox is not empty: {entries} entries, {pending} pending")
    found.counts["resumes"] = {"tool steps run (each exactly once)": once, "outbox left": entries}
    return found
