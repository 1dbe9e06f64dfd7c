"""The fleet test's checks: what must hold once the fleet has drained, and the counts it prints.

Every recorded outcome is held against what the webhook receiver meant (`judge`), every refund
step against the demo ledger's attempt count, every failed run against the short list of
reasons a SIGKILLed worker may cause, and the faults against the plan (every role killed,
nothing died on its own).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from redis import Redis
from redis.exceptions import ResponseError
from refunds_demo import Ledger
from rq.exceptions import NoSuchJobError
from rq.job import Job
from rq.serializers import JSONSerializer

from broker.domain.models import Request, Run, RunStatus, Status
from broker.facade import Broker
from broker.runs.live_wait import LIVE, claimed_by
from broker.runs.starting import resume_job_id, run_job_id, run_queue
from broker.store.keys import RESUMER_GROUP
from tests.support.fakes.deciding_receiver import Answered, DecidingReceiver, Intent
from tests.support.fleet_processes import ROLES, Events

FINAL = (RunStatus.finished, RunStatus.failed)
REJECT_REASON = "Photos show wear, not damage"
ENDPOINT = "fleet"
BOT = "fleet-bot"
BY_WEBHOOK = f"webhook:{ENDPOINT}/{BOT}"
"""How the broker records a reply from the receiver (`decided_by`)."""
FAILED_RUN_REASONS = {
    # a worker was SIGKILLed while one of the run's tools ran; the retry refuses to run it again
    "worker killed mid tool step": "while its tools were running on worker ",
    # the work horse was SIGKILLed on the job's last attempt
    "worker killed on the last attempt": "the worker process running this round died",
}
"""The only reasons a run may fail here (substrings of the runner's and the jobs' errors)."""
WORKER_CONCURRENCY = 50
"""Runs one fleet worker advances at once (`[workers] concurrency`'s default)."""


@dataclass
class Started:
    """A run the app started, for the customer whose ledger it refunds from."""

    index: int
    run_id: str
    customer: str
    amount: int


def outcome_events(broker: Broker, queue: str = "default") -> Counter[str]:
    """Outcome events (decided or timed out) per request id in the queue's stream (every
    partition's, on a cluster)."""
    counts: Counter[str] = Counter()
    for part in broker.keys.parts():
        stream, cursor = part.stream(queue), "-"
        while True:
            rows = broker.redis.xrange(stream, cursor, "+", count=5000)
            for _, fields in rows:
                kind = fields.get(b"type", b"").decode()
                if kind in ("approval.decided", "approval.timed_out"):
                    counts[fields[b"request_id"].decode()] += 1
            if len(rows) < 5000:
                break
            ms, seq = rows[-1][0].decode().split("-")
            cursor = f"{ms}-{int(seq) + 1}"
    return counts


def outbox_left(broker: Broker) -> tuple[int, int]:
    """(entries, entries handed out and not acknowledged) over every partition's outboxes
    (`resumes`, and `resumes_direct`, where an API killed between a step and its enqueue
    leaves the entry for the resumer)."""
    entries = pending = 0
    for part in broker.keys.parts():
        for stream in (part.resumes, part.resumes_direct):
            entries += int(broker.redis.xlen(stream))
            pending += group_pending(broker.redis, stream, RESUMER_GROUP)
    return entries, pending


@dataclass
class Findings:
    """The counts to print, and each check that failed with a few examples."""

    counts: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    requests: dict[str, Request] = field(default_factory=dict)
    """Every request of the runs, by id, as read at the end (for checks of other channels)."""

    def bad(self, what: str, examples: list[str]) -> None:
        if examples:
            self.problems.append(f"{what}: {len(examples)}, e.g. {examples[:3]}")


LATE = ("late reply: sent after expires_at", "late reply: in flight at expires_at")
"""The one race allowed between the receiver's intent and the outcome (see `judge`)."""


def judge(
    request: Request, intent: Intent, answered: Answered | None, by_whom: str = BY_WEBHOOK
) -> str | None:
    """Hold a request's recorded outcome against what the receiver meant; None if they match.

    approve -> approved, reject -> rejected with its reason, both decided by `by_whom` (the
    endpoint; the approver, for a person deciding in a chat);
    silent -> timed out by the sweeper, and no reply was ever sent. The one allowed mismatch,
    named LATE: a reply that had not landed when the request expired, so the sweeper was first.
    It is allowed only when the sweeper's decided_at lies between expires_at and the moment the
    reply's answering try came back, and that answer was a 409 showing the request timed out.
    Anything else is returned as the problem.
    """
    status, decision = request.status.value, request.decision
    if decision is None:
        return f"{intent.action} -> {status} without a decision"
    by = decision.decided_by
    if intent.action == "silent":
        if answered is not None:
            return f"silent, yet a reply was sent: {answered}"
        if status != "timed_out" or by != "sweeper":
            return f"silent -> {status} by {by}"
        return None
    expected = {"approve": "approved", "reject": "rejected"}.get(intent.action)
    if expected is None or answered is None:
        return f"{intent.action}: {'unknown intent' if expected is None else 'never answered'}"
    if status == expected:
        if by != by_whom:
            return f"{intent.action} -> {status} by {by}, not {by_whom}"
        if expected == "rejected" and decision.reason != REJECT_REASON:
            return f"reject -> rejected with reason {decision.reason!r}"
        if answered.final_status != expected:
            return f"{intent.action} -> {status}, but the API answered {answered}"
        return None
    if status == "timed_out" and by == "sweeper" and decision.decided_at is not None:
        swept_at = decision.decided_at.timestamp()
        late = (
            answered.status == 409
            and answered.final_status == "timed_out"
            and intent.expires_at - 1e-3 <= swept_at <= answered.at
        )
        if late:
            return LATE[0] if answered.sent_at >= intent.expires_at else LATE[1]
    return (
        f"{intent.action} -> {status} by {by} at {decision.decided_at}; expires_at "
        f"{intent.expires_at:.3f}, reply {answered}"
    )


def check(
    broker: Broker,
    receiver: DecidingReceiver,
    started: list[Started],
    events: Events,
    *,
    kills_planned: bool,
    webhook_queue: str = "default",
) -> Findings:
    """Everything that must hold once the fleet has drained; `found.problems` lists what didn't.

    The outcomes of the requests in `webhook_queue` are held against the webhook receiver's
    intents; those of other queues are the caller's to check (`tests.fleet_telegram_checks`).
    """
    found = Findings()
    redis = broker.redis
    # every run the app started is there: starting one was acknowledged, so Redis must keep it
    # through its SIGKILL (it fsyncs before it answers)
    gone = [s.run_id for s in started if not redis.exists(broker.keys.run(s.run_id))]
    found.bad("runs the app started that Redis no longer has (acknowledged, then lost)", gone)
    found.counts["runs"] = {"started": len(started)}
    started = [s for s in started if s.run_id not in gone]
    runs = {s.run_id: broker.get_run(s.run_id) for s in started}
    requests = {r.id: r for r in broker.get_requests(all_request_ids(broker, started))}
    found.requests = requests
    by_run = {r.run_id: r for r in requests.values()}

    # every run finished, or failed for a reason on the list, no more often than workers died
    status = Counter(r.status.value for r in runs.values())
    found.counts["runs"] |= status
    stuck = [r for r in runs.values() if r.status not in FINAL]
    found.bad("runs neither finished nor failed", [_stuck(broker, r) for r in stuck])
    if stuck:
        lock = run_queue(broker).registry_cleaning_key
        found.counts["RQ maintenance lock TTL at the end (s)"] = redis.ttl(lock)
    failed = [r for r in runs.values() if r.status is RunStatus.failed]
    why = {r.id: _failure_kind(r.error or "") for r in failed}
    found.bad(
        "failed runs whose reason is not on the list (FAILED_RUN_REASONS)",
        [f"{r.id}: {(r.error or '(none)')[:160]}" for r in failed if why[r.id] is None],
    )
    # a worker advances many runs at once, so one SIGKILL may catch several runs' tools; each
    # such run must name a worker process the harness killed, and no more may fail than the
    # killed workers could hold
    killed = events.killed_pids["worker"]
    found.bad(
        "runs failed mid tool step on a worker that was never SIGKILLed",
        [
            f"{r.id}: {(r.error or '')[:200]}"
            for r in failed
            if why[r.id] == "worker killed mid tool step"
            and _worker_pid(r.error or "") not in killed
        ],
    )
    if len(failed) > events.kills["worker"] * WORKER_CONCURRENCY:
        found.problems.append(
            f"{len(failed)} failed runs but only {events.kills['worker']} worker SIGKILLs "
            f"of {WORKER_CONCURRENCY} runs each"
        )
    if failed:
        found.counts["failed runs by reason"] = dict(Counter(str(k) for k in why.values()))

    # every request has exactly one outcome
    found.counts["requests"] = dict(Counter(r.status.value for r in requests.values()))
    found.counts["requests"]["total"] = len(requests)
    found.bad(
        "finished runs that never asked for approval",
        [rid for rid, r in runs.items() if r.status is RunStatus.finished and rid not in by_run],
    )
    found.bad(
        "requests without an outcome",
        [f"{r.id} {r.status.value}" for r in requests.values() if r.is_pending or not r.decision],
    )
    webhook_requests = {k: r for k, r in requests.items() if r.queue == webhook_queue}
    check_outcomes(found, broker, webhook_requests, receiver, queue=webhook_queue)
    check_resumes(found, broker, redis, started, runs, by_run)

    # every dead letter has a cause
    letters = broker.dead_letters(100_000)
    found.bad(
        "dead letters without a cause",
        [eid for eid, f in letters if not f.get("error") or not f.get("source")],
    )
    found.counts["dead letters"] = dict(Counter(f.get("source", "?") for _, f in letters))

    # the faults happened as planned, and none on their own
    if kills_planned:
        found.bad(
            "roles never SIGKILLed",
            [kind for kind in ROLES if events.kills[kind] < 1],
        )
    found.bad("processes that died on their own", events.self_deaths)
    return found


def check_outcomes(
    found: Findings,
    broker: Broker,
    requests: dict[str, Request],
    receiver: DecidingReceiver,
    queue: str = "default",
) -> None:
    """One outcome per request (one event in its stream, one at the webhook), and each the
    outcome the receiver meant (`judge`); every reply the API acknowledged is counted."""
    events = outcome_events(broker, queue)
    found.bad(
        "requests without exactly one outcome event",
        [f"{rid} x{events[rid]}" for rid in requests if events[rid] != 1],
    )
    webhook_outcomes = {rid: len(receiver.outcomes.get(rid, ())) for rid in requests}
    found.bad(
        "requests whose outcome reached the webhook as other than one event",
        [f"{rid} x{n}" for rid, n in webhook_outcomes.items() if n != 1],
    )
    found.bad(
        "requests that never reached the webhook",
        [rid for rid in requests if rid not in receiver.intents],
    )
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


def check_resumes(
    found: Findings,
    broker: Broker,
    rq: Redis,
    started: list[Started],
    runs: dict[str, Run],
    by_run: dict[str, Request],
) -> None:
    """One resume job per answered round (its id is deterministic, so RQ holds one) unless the
    job that paused it went on with it (a live wait), every
    refund step of an approved call run once (what a doubled resume would break), each run's
    output what its decision says, and the outbox drained. `rq` is where RQ keeps its jobs."""
    once, resumes, twice, wrong = 0, [], [], []
    for s in started:
        run, request = runs[s.run_id], by_run.get(s.run_id)
        if request is None or request.is_pending:
            continue
        ledger = Ledger(broker.redis, broker.keys.prefix, s.customer)
        refunds = ledger.all()
        # the round went on either in the job that paused it (a live wait, claimed `live`) or
        # in its resume job: one of the two, never both
        live = claimed_by(broker, s.run_id, 1) == LIVE
        resumed = Job.exists(resume_job_id(s.run_id, 1), connection=rq)
        if live and resumed:
            resumes.append(f"{s.run_id}: round 1 went on live and has a resume job too")
            continue
        if not live and not resumed:
            resumes.append(f"{s.run_id}: no resume job for its answered round 1")
            continue
        if Job.exists(resume_job_id(s.run_id, 2), connection=rq):
            resumes.append(f"{s.run_id}: a resume job for a round 2 it never had")
        attempts = ledger.attempts(request.tool_call_id)
        approved = request.status is Status.approved
        finished = run.status is RunStatus.finished
        if attempts > 1 or (attempts and not approved) or (approved and finished and not attempts):
            twice.append(f"{s.run_id} {request.status.value} {run.status.value}: {attempts}x")
        elif attempts == 1:
            once += 1
        if not finished:
            continue
        output = run.output if isinstance(run.output, dict) else {}
        if approved:
            ok = output.get("refunded") is True and [
                (r.run_id, r.tool_call_id) for r in refunds
            ] == [(s.run_id, request.tool_call_id)]
        elif request.status is Status.rejected:
            ok = (
                output.get("refunded") is False
                and REJECT_REASON in str(output.get("message"))
                and not refunds
            )
        else:
            ok = (
                output.get("refunded") is False
                and "No one answered" in str(output.get("message"))
                and not refunds
            )
        if not ok:
            wrong.append(f"{s.run_id} {request.status.value}: {output} refunds={refunds}")
    found.bad(
        "answered rounds neither gone on live nor with their resume job (one id per round), or with both, or with a round 2",
        resumes,
    )
    found.bad(
        "refund steps that ran other than once per approved call (never when not approved)",
        twice,
    )
    found.bad("runs whose outcome and refund disagree with their decision", wrong)
    entries, pending = outbox_left(broker)
    if entries or pending:
        found.problems.append(f"the outbox is not empty: {entries} entries, {pending} pending")
    found.counts["resumes"] = {
        "refund steps run (each exactly once)": once,
        "outbox entries left": entries,
    }


def _stuck(broker: Broker, run: Run) -> str:
    """A run that never ended, with where its current round's RQ job stands (for diagnosis)."""
    job_id = run_job_id(run.id) if run.round == 0 else resume_job_id(run.id, run.round)
    try:
        job = Job.fetch(job_id, connection=broker.redis, serializer=JSONSerializer)
        where = f"{job.get_status()}, retries left {job.retries_left}, worker {job.worker_name}"
    except NoSuchJobError:
        where = "no such job"
    return f"{run.id} {run.status.value} round {run.round}: job {job_id} {where}"


def _worker_pid(error: str) -> int | None:
    """The pid in "… on worker HOST:PID …", the runner's name for the worker taking the step."""
    found = re.search(r" on worker \S+:(\d+) ", error)
    return int(found.group(1)) if found else None


def _failure_kind(error: str) -> str | None:
    return next((k for k, text in FAILED_RUN_REASONS.items() if text in error), None)


def group_pending(redis: Redis, stream: str, group: str) -> int:
    """Entries of `stream` handed out to `group` and not acknowledged (0 if there is no group)."""
    try:
        return int(redis.xpending(stream, group)["pending"])
    except ResponseError:  # NOGROUP: nothing was ever read from it
        return 0


def all_request_ids(broker: Broker, started: list[Started]) -> list[str]:
    pipe = broker.redis.pipeline(transaction=False)
    for s in started:
        pipe.lrange(broker.keys.run_round(s.run_id, 1), 0, -1)
    return [rid.decode() for ids in pipe.execute() for rid in ids]
