"""Issue 8: a horizontally scaled fleet holds under faults.

A real fleet of separate OS processes on one Redis with AOF: 2 API processes, 3 notifiers,
2 agent workers (RQ's forking Worker, `--no-resumer`), 2 sweepers and the resumer. The test
process is the app and the people: it starts runs of the demo refunds agent (each run for a
customer of its own, so each has its own order to refund), and a webhook receiver
(`tests/fakes/deciding_receiver.py`) approves, rejects or ignores each approval request it is
sent, replying through the signed `/v1/webhooks/{name}/replies` of either API process. Ignored
requests time out through the sweepers.

Meanwhile a random role process is SIGKILLed (with its RQ work horse, if any) every few
seconds and restarted, and Redis itself is SIGKILLed once and started again on the same port
and data directory. Processes that die on their own are restarted too, and reported.

At the end: every run finished or failed with a reason; every request has exactly one outcome
(one outcome event in its stream, none pending); no run was resumed twice in a round (one RQ
resume job per answered round, the approved refund step ran no more often than its resume job
did, one refund per approved run and none otherwise); every request reached the webhook; every
dead letter has a cause. The counts are printed and written to `fleet-counts.txt` in the
test's tmp dir.

Knobs (environment): APPROVAL_BROKER_FLEET_RUNS (default 2000), APPROVAL_BROKER_FLEET_KILL_EVERY_S
(default 4; 0 disables the kills), APPROVAL_BROKER_FLEET_INFLIGHT (default 120 unfinished runs).
"""

from __future__ import annotations

import base64
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis import Redis
from redis.exceptions import RedisError
from rq.exceptions import NoSuchJobError
from rq.job import Job
from rq.serializers import JSONSerializer
from standardwebhooks import Webhook

from api.app import create_app
from api.testing import ServerThread as ApiServer
from broker.client import Broker
from broker.config import Settings, load_config, parse_config
from broker.keys import NOTIFIER_GROUP
from broker.models import Decision, NewRequest, RunStatus, Status
from broker.redis_server import EmbeddedRedis, free_port
from broker.runs import resume_job_id, start_run
from tests.conftest import wait_for
from tests.fakes.deciding_receiver import DecidingReceiver, Policy, mix_policy
from tests.proc import alive, descendants
from workers.demo import AGENT_NAME, Ledger, register_demo

RUNS = int(os.environ.get("APPROVAL_BROKER_FLEET_RUNS", "2000"))
KILL_EVERY_S = float(os.environ.get("APPROVAL_BROKER_FLEET_KILL_EVERY_S", "4"))
MAX_INFLIGHT = int(os.environ.get("APPROVAL_BROKER_FLEET_INFLIGHT", "120"))
MIX = {"approve": 5, "reject": 3, "ignore": 2}
REJECT_REASON = "Photos show wear, not damage"
QUEUE_TIMEOUT_S = 4
PREFIX = "fleet:"
SECRET = "whsec_" + base64.b64encode(b"fleet-test-secret-0123456789abcd").decode()
DRAIN_BUDGET_S = 240.0
STALL_RESTART_S = 20.0
FINAL = (RunStatus.finished, RunStatus.failed)
CLI = [sys.executable, "-m", "approval_broker"]


# ---- the fleet's processes ------------------------------------------------------------------


@dataclass
class Member:
    """One role process of the fleet, restartable under the same name."""

    name: str
    kind: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    url: str | None = None
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0

    def start(self) -> None:
        self.starts += 1
        with self.log.open("ab") as sink:
            sink.write(f"\n=== start #{self.starts} at {time.time():.3f}\n".encode())
            sink.flush()
            self.process = subprocess.Popen(
                [*CLI, *self.argv],
                env=self.env,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def exited(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def kill_tree(self) -> int:
        """SIGKILL the process and everything below it (an RQ work horse is its own group)."""
        assert self.process is not None
        victims = [self.pid, *descendants(self.pid)]
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.wait(10)
        return len(victims)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM (RQ: finish the job in hand), then SIGKILL whatever is left."""
        if self.process is None:
            return
        tree = [self.pid, *descendants(self.pid)]
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        for pid in tree:
            if alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.process.wait(10)

    def cpu_s(self) -> float:
        """CPU seconds of this incarnation and its reaped children (RQ work horses)."""
        if self.process is None or self.process.poll() is not None:
            return 0.0
        try:
            stat = Path(f"/proc/{self.pid}/stat").read_text()
        except OSError:
            return 0.0
        fields = stat[stat.rindex(")") + 2 :].split()
        return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")

    def tail(self, lines: int = 6) -> str:
        text = self.log.read_text(errors="replace").strip().splitlines()
        return "\n      ".join(text[-lines:])


@dataclass
class Events:
    """What the harness did and saw, for the report."""

    kills: Counter[str] = field(default_factory=Counter)
    self_deaths: list[str] = field(default_factory=list)
    maintenance_restarts: int = 0
    redis_down_s: float = 0.0
    redis_restarted_at_run: int = 0
    start_errors: list[str] = field(default_factory=list)


class Fleet:
    def __init__(self, env: dict[str, str], logs: Path, api_ports: list[int]) -> None:
        self.events = Events()
        self.lock = threading.Lock()
        self.members: list[Member] = []
        self.api_urls = [f"http://127.0.0.1:{p}" for p in api_ports]
        roles: list[tuple[str, list[str]]] = [
            *(("api", ["api", "--port", str(p)]) for p in api_ports),
            *(("notifier", ["notifier"]) for _ in range(3)),
            *(("worker", ["worker", "--no-resumer"]) for _ in range(2)),
            *(("sweeper", ["sweeper"]) for _ in range(2)),
            ("resumer", ["resumer"]),
        ]
        seen: Counter[str] = Counter()
        for kind, argv in roles:
            seen[kind] += 1
            name = f"{kind}-{seen[kind]}"
            url = self.api_urls[seen[kind] - 1] if kind == "api" else None
            self.members.append(Member(name, kind, argv, env, logs / f"{name}.log", url))
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self, timeout: float = 60.0) -> None:
        for member in self.members:
            member.start()
        deadline = time.monotonic() + timeout
        for member in self.members:
            while not self._ready(member):
                if member.exited() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"{member.name} did not start:\n      {member.tail()}")
                time.sleep(0.1)

    def _ready(self, member: Member) -> bool:
        if member.url:
            try:
                return httpx.get(f"{member.url}/healthz").is_success
            except httpx.HTTPError:
                return False
        return len(member.log.read_bytes().strip().splitlines()) > 1  # said something

    def supervise(self) -> None:
        """Restart a process that exited without being killed by the harness, and note it."""
        while not self._stop.wait(0.2):
            with self.lock:
                for member in self.members:
                    code = member.exited()
                    if code is not None:
                        self.events.self_deaths.append(
                            f"{member.name} exited with {code} at {time.strftime('%X')}:"
                            f"\n      {member.tail()}"
                        )
                        member.start()

    def chaos(self, every_s: float, rng: random.Random) -> None:
        """SIGKILL a random role process (and its work horse) every `every_s` s, and restart it."""
        if every_s <= 0:
            return
        while not self._stop.wait(rng.uniform(every_s * 0.5, every_s * 1.5)):
            with self.lock:
                victim = rng.choice(self.members)
                victim.kill_tree()
                self.events.kills[victim.kind] += 1
                victim.start()

    def restart_one(self, kind: str) -> None:
        """A graceful restart of one process of `kind` (RQ runs its registry maintenance at start)."""
        with self.lock:
            member = next(m for m in self.members if m.kind == kind)
            member.stop()
            member.start()
            self.events.maintenance_restarts += 1

    def run_in_background(self, rng: random.Random, every_s: float) -> None:
        for target, args in ((self.supervise, ()), (self.chaos, (every_s, rng))):
            thread = threading.Thread(target=target, args=args, daemon=True)
            thread.start()
            self._threads.append(thread)

    def calm(self) -> None:
        """Stop killing and supervising (the processes keep running)."""
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def cpu_by_kind(self) -> dict[str, float]:
        """CPU seconds per kind of role, counting only the processes running now."""
        cpu: Counter[str] = Counter()
        for member in self.members:
            cpu[member.kind] += member.cpu_s()
        return {kind: round(seconds, 1) for kind, seconds in cpu.items()}

    def stop(self) -> None:
        self.calm()
        for member in self.members:
            member.stop()


# ---- the app: starting runs, following them ---------------------------------------------------


@dataclass
class Started:
    index: int
    run_id: str
    customer: str
    amount: int


class Tracker:
    """Which started runs are not finished or failed yet (polled in one pipeline)."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.open: set[str] = set()
        self.lock = threading.Lock()
        self.last_change = time.monotonic()

    def add(self, run_id: str) -> None:
        with self.lock:
            self.open.add(run_id)

    def poll(self) -> int:
        """How many are still open (as last seen, if Redis does not answer right now)."""
        try:
            self._refresh()
        except RedisError:
            pass
        with self.lock:
            return len(self.open)

    def _refresh(self) -> None:
        with self.lock:
            ids = list(self.open)
        if ids:
            pipe = self.broker.redis.pipeline(transaction=False)
            for rid in ids:
                pipe.hget(self.broker.keys.run(rid), "status")
            done = {
                rid
                for rid, status in zip(ids, pipe.execute(), strict=True)
                if status is not None and RunStatus(status.decode()) in FINAL
            }
            if done:
                with self.lock:
                    self.open -= done
                self.last_change = time.monotonic()
        with self.lock:
            return len(self.open)


def prompt_for(i: int) -> tuple[str, int]:
    amount = 60 + (i * 7) % 170  # above the $50 auto-refund limit, within A103's $240
    return f"Refund ${amount} on order A103 because the tent floor tore (case {i}).", amount


def drive(
    broker: Broker,
    tracker: Tracker,
    started: list[Started],
    gate: threading.Event,
    gate_lock: threading.Lock,
    events: Events,
    n: int,
    halt: threading.Event,
) -> None:
    """Start `n` runs, keeping at most MAX_INFLIGHT unfinished; pauses while `gate` is clear."""
    i = 0
    while i < n and not halt.is_set():
        while tracker.poll() >= MAX_INFLIGHT and not halt.is_set():
            time.sleep(0.2)
        gate.wait()
        prompt, amount = prompt_for(i)
        customer = f"c{i:05d}"
        with gate_lock:
            try:
                run = start_run(broker, AGENT_NAME, prompt, deps={"customer": customer})
            except RedisError as exc:  # the app retries; report it
                events.start_errors.append(f"run {i}: {type(exc).__name__}: {exc}")
                time.sleep(0.2)
                continue
        started.append(Started(i, run.id, customer, amount))
        tracker.add(run.id)
        i += 1


def restart_redis(
    server: EmbeddedRedis, gate: threading.Event, gate_lock: threading.Lock, events: Events
) -> None:
    """SIGKILL Redis and start it again on the same port and data dir; the app holds off."""
    gate.clear()
    with gate_lock:
        down = time.monotonic()
        server.kill()
        server.start(timeout=60)
        events.redis_down_s = time.monotonic() - down
    gate.set()


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout:.0f} s")
        time.sleep(0.25)


# ---- checking ---------------------------------------------------------------------------------


def outcome_events(broker: Broker) -> Counter[str]:
    """Outcome events (decided or timed out) per request id in the handler queue's stream."""
    counts: Counter[str] = Counter()
    stream = broker.keys.stream("default")
    cursor = "-"
    while True:
        rows = broker.redis.xrange(stream, cursor, "+", count=5000)
        for _, fields in rows:
            kind = fields.get(b"type", b"").decode()
            if kind in ("approval.decided", "approval.timed_out"):
                counts[fields[b"request_id"].decode()] += 1
        if len(rows) < 5000:
            return counts
        last = rows[-1][0].decode()
        ms, seq = last.split("-")
        cursor = f"{ms}-{int(seq) + 1}"


def resume_executions(redis: Redis, run_id: str) -> int | None:
    """How many times the resume job of round 1 ran (1 + retries used), None if it doesn't exist."""
    try:
        job = Job.fetch(resume_job_id(run_id, 1), connection=redis, serializer=JSONSerializer)
    except NoSuchJobError:
        return None
    retries = job.retry_intervals and len(job.retry_intervals)
    left = job.retries_left if job.retries_left is not None else retries
    return 1 + max(0, (retries or 0) - (left or 0))


@dataclass
class Findings:
    counts: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def bad(self, what: str, examples: list[str]) -> None:
        if examples:
            self.problems.append(f"{what}: {len(examples)}, e.g. {examples[:3]}")


def _meant(policy: Policy, request: dict[str, Any]) -> str:
    reply = policy(request)
    return "ignore" if reply is None else str(reply["outcome"])


def check(
    broker: Broker, receiver: DecidingReceiver, policy: Policy, started: list[Started]
) -> Findings:
    found = Findings()
    redis = broker.redis
    runs = {s.run_id: broker.get_run(s.run_id) for s in started}
    requests = {r.id: r for r in broker.get_requests(_all_request_ids(broker, started))}
    by_run = {r.run_id: r for r in requests.values()}

    # every run finished or failed with a reason
    status = Counter(r.status.value for r in runs.values())
    found.counts["runs"] = {"started": len(started), **status}
    found.bad(
        "runs neither finished nor failed",
        [f"{r.id} {r.status.value}" for r in runs.values() if r.status not in FINAL],
    )
    found.bad(
        "failed runs without a reason",
        [r.id for r in runs.values() if r.status is RunStatus.failed and not r.error],
    )
    reasons = Counter((r.error or "")[:90] for r in runs.values() if r.status is RunStatus.failed)
    if reasons:
        found.counts["failed run reasons"] = dict(reasons)

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
    events = outcome_events(broker)
    found.bad(
        "requests without exactly one outcome event",
        [f"{rid} x{events[rid]}" for rid in requests if events[rid] != 1],
    )
    webhook_outcomes = {rid: len(receiver.outcomes.get(rid, ())) for rid in requests}
    found.bad(
        "requests whose outcome reached the webhook as other than one event",
        [f"{rid} x{n}" for rid, n in webhook_outcomes.items() if n != 1],
    )

    # every request reached its webhook at least once
    found.bad(
        "requests that never reached the webhook",
        [rid for rid in requests if rid not in receiver.requested_at],
    )

    # no run resumed twice in a round, and each resume did what its outcome said
    once, twice_explained, unexplained, wrong = 0, 0, [], []
    for s in started:
        run, request = runs[s.run_id], by_run.get(s.run_id)
        if request is None or request.is_pending:
            continue
        ledger = Ledger(redis, broker.keys.prefix, s.customer)
        refunds = ledger.all()
        executions = resume_executions(redis, s.run_id)
        if executions is None:
            unexplained.append(f"{s.run_id}: no resume job for its answered round 1")
            continue
        if Job.exists(resume_job_id(s.run_id, 2), connection=redis):
            unexplained.append(f"{s.run_id}: a resume job for a round 2 it never had")
        attempts = ledger.attempts(request.tool_call_id)
        if attempts > executions:
            unexplained.append(f"{s.run_id}: refund step ran {attempts}x in {executions} job(s)")
        elif attempts > 1:
            twice_explained += 1
        else:
            once += 1
        if run.status is not RunStatus.finished:
            continue
        output = run.output if isinstance(run.output, dict) else {}
        if request.status is Status.approved:
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
    found.bad("runs resumed more than once in a round", unexplained)
    found.bad("runs whose outcome and refund disagree with their decision", wrong)
    found.counts["resumes"] = {
        "refund step ran once per resume job": once,
        "ran again in a retried resume job (work horse killed)": twice_explained,
        "outbox entries left": redis.xlen(broker.keys.resumes),
    }

    # every dead letter has a cause
    letters = broker.dead_letters(100_000)
    found.bad(
        "dead letters without a cause",
        [eid for eid, f in letters if not f.get("error") or not f.get("source")],
    )
    found.counts["dead letters"] = dict(Counter(f.get("source", "?") for _, f in letters))

    # what the people at the webhook meant to do, and what came of it
    meant = Counter(f"{_meant(policy, r.public())} -> {r.status.value}" for r in requests.values())
    found.counts["webhook"] = {**receiver.stats(), "meant -> outcome": dict(sorted(meant.items()))}
    found.bad("replies the API refused", receiver.failures)
    return found


def _all_request_ids(broker: Broker, started: list[Started]) -> list[str]:
    pipe = broker.redis.pipeline(transaction=False)
    for s in started:
        pipe.lrange(broker.keys.run_round(s.run_id, 1), 0, -1)
    return [rid.decode() for ids in pipe.execute() for rid in ids]


# ---- the test ---------------------------------------------------------------------------------


@pytest.fixture
def fleet_redis(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    """The fleet's own Redis (AOF on), which the test restarts."""
    server = EmbeddedRedis(tmp_path / "redis").start()
    yield server
    server.close()


@pytest.mark.fleet
@pytest.mark.timeout(1500)
def test_fleet_holds_under_kills_and_a_redis_restart(
    fleet_redis: EmbeddedRedis, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = random.Random(8)
    api_ports = [free_port(), free_port()]
    policy = mix_policy(MIX, REJECT_REASON)
    receiver = DecidingReceiver(
        SECRET,
        [f"http://127.0.0.1:{p}" for p in api_ports],
        endpoint="fleet",
        policy=policy,
        threads=8,
    ).start()
    config_path = tmp_path / "fleet.toml"
    config_path.write_text(
        f"""
[queues.default]
channels = ["webhook:fleet"]
timeout_s = {QUEUE_TIMEOUT_S}

[webhooks.fleet]
url = "{receiver.url("/hook")}"
secret = "{SECRET}"
roles = ["ops"]
max_attempts = 30
backoff_s = 0.05
max_backoff_s = 1.0
timeout_s = 5
"""
    )
    redis = Redis.from_url(fleet_redis.url)
    broker = Broker(redis, load_config(config_path), prefix=PREFIX)
    register_demo(broker)
    env = {
        **os.environ,
        "APPROVAL_BROKER_REDIS_URL": fleet_redis.url,
        "APPROVAL_BROKER_CONFIG": str(config_path),
        "APPROVAL_BROKER_KEY_PREFIX": PREFIX,
        "APPROVAL_BROKER_ADMIN_TOKEN": "fleet-admin-token-0123456789",
        "APPROVAL_BROKER_DATA_DIR": str(tmp_path / "data"),
        "APPROVAL_BROKER_NOTIFIER_CLAIM_IDLE_S": "2",
        "APPROVAL_BROKER_NOTIFIER_BLOCK_MS": "200",
        "APPROVAL_BROKER_NOTIFIER_WORKERS": "4",
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("APPROVAL_BROKER_DEMO_MODEL", None)
    env.pop("APPROVAL_BROKER_NOTIFIER_NAME", None)
    logs = tmp_path / "logs"
    logs.mkdir()
    fleet = Fleet(env, logs, api_ports)
    tracker = Tracker(broker)
    started: list[Started] = []
    gate, gate_lock, halt = threading.Event(), threading.Lock(), threading.Event()
    gate.set()
    times: dict[str, float] = {}
    cpu: dict[str, float] = {}
    t0 = time.monotonic()
    try:
        fleet.start()
        times["fleet started"] = time.monotonic() - t0
        fleet.run_in_background(rng, KILL_EVERY_S)
        driver = threading.Thread(
            target=drive,
            args=(broker, tracker, started, gate, gate_lock, fleet.events, RUNS, halt),
            daemon=True,
        )
        driver.start()

        # restart Redis once, about a third of the way through
        wait_until(lambda: len(started) >= RUNS // 3, 600, "a third of the runs did not start")
        fleet.events.redis_restarted_at_run = len(started)
        restart_redis(fleet_redis, gate, gate_lock, fleet.events)

        driver.join(900)
        times["all runs started"] = time.monotonic() - t0
        fleet.calm()  # no more kills: the rest must finish on its own

        # drain: RQ recovers a job whose horse was killed only in a worker's maintenance pass
        # (at its start, then every 10 min) once the job's 90 s heartbeat has run out; a
        # graceful worker restart when progress stalls stands in for the next pass.
        deadline = time.monotonic() + DRAIN_BUDGET_S
        while tracker.poll():
            if time.monotonic() > deadline:
                break
            if time.monotonic() - tracker.last_change > STALL_RESTART_S:
                fleet.restart_one("worker")
                tracker.last_change = time.monotonic()
            time.sleep(0.5)
        times["all runs final"] = time.monotonic() - t0

        # the outcome events reach the webhook too
        request_ids = _all_request_ids(broker, started)

        def delivered() -> bool:
            pending = redis.xpending(broker.keys.stream("default"), NOTIFIER_GROUP)["pending"]
            return int(pending) == 0 and all(rid in receiver.outcomes for rid in request_ids)

        try:
            wait_until(delivered, 60, "outcome events were not all delivered")
        except AssertionError:
            pass  # reported by the checks below
        times["deliveries settled"] = time.monotonic() - t0
        cpu = fleet.cpu_by_kind()
        cpu["test process (app, receiver, checks)"] = round(sum(os.times()[:2]), 1)
        used = redis.info("cpu")
        cpu["redis"] = round(float(used["used_cpu_user"]) + float(used["used_cpu_sys"]), 1)
    finally:
        halt.set()
        gate.set()
        fleet.stop()
        receiver.stop()

    found = check(broker, receiver, policy, started)
    events = fleet.events
    found.counts["faults"] = {
        "SIGKILLs by kind": dict(events.kills),
        "Redis restart": f"SIGKILLed at run {events.redis_restarted_at_run}, "
        f"back after {events.redis_down_s:.2f} s",
        "died on their own (restarted)": len(events.self_deaths),
        "graceful worker restarts in the drain": events.maintenance_restarts,
        "app start_run errors": len(events.start_errors),
    }
    found.counts["seconds"] = {k: round(v, 1) for k, v in times.items()}
    found.counts["cpu seconds (processes alive at the end)"] = cpu
    report = "fleet test counts\n" + json.dumps(found.counts, indent=2)
    if events.self_deaths:
        report += "\nprocesses that died on their own:\n  " + "\n  ".join(events.self_deaths)
    if found.problems:
        report += "\nPROBLEMS:\n  " + "\n  ".join(found.problems)
    (tmp_path / "fleet-counts.txt").write_text(report + "\n")
    with capsys.disabled():
        print("\n" + report + f"\n(written to {tmp_path / 'fleet-counts.txt'})", flush=True)
    redis.close()
    assert not found.problems, "\n".join(found.problems)
    assert len(started) == RUNS


# ---- the harness's receiver, checked on its own (fast) ---------------------------------------


def _signed(
    payload: dict[str, Any], msg_id: str, secret: str = SECRET
) -> tuple[bytes, dict[str, str]]:
    body = json.dumps(payload)
    now = datetime.now(UTC)
    headers = {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": Webhook(secret).sign(msg_id, now, body),
    }
    return body.encode(), headers


def test_deciding_receiver_answers_each_request_once_through_a_live_api(redis_url: str) -> None:
    config = parse_config(
        {
            "queues": {"default": {"channels": ["webhook:fleet"]}},
            "webhooks": {"fleet": {"url": "http://127.0.0.1:9/unused", "secret": SECRET}},
        }
    )
    broker = Broker(Redis.from_url(redis_url), config, prefix="t:")
    approve, reject, ignore, taken = (
        broker.create_request(NewRequest(tool_name="refund", args={"n": n})) for n in range(4)
    )
    broker.decide(taken.id, Decision(outcome="rejected", reason="no"), decided_by="alice")
    plan = {approve.id: {"outcome": "approved"}, taken.id: {"outcome": "approved"}}
    plan[reject.id] = {"outcome": "rejected", "reason": REJECT_REASON}
    app = create_app(Settings(redis_url=redis_url, key_prefix="t:"), config, broker)
    with ApiServer(app) as api:
        # the first API "process" is down: every reply moves on to the live one
        receiver = DecidingReceiver(
            SECRET,
            [f"http://127.0.0.1:{free_port()}", api.url],
            endpoint="fleet",
            policy=lambda request: plan.get(request["id"]),
        ).start()
        try:
            for request in (approve, reject, ignore, taken, approve):  # `approve` twice
                event = {"type": "approval.requested", "timestamp": "x", "data": request.public()}
                body, headers = _signed(event, f"msg_{request.id}")
                assert receiver.receive(headers, body) == 204
            forged, headers = _signed({"type": "approval.requested", "data": {"id": "x"}}, "m", "whsec_" + base64.b64encode(b"someone-else-entirely-0123456789").decode())  # fmt: skip
            assert receiver.receive(headers, forged) == 401
            wait_for(lambda: len(receiver.answered) == 3)
        finally:
            receiver.stop()

    assert broker.get_request(approve.id).decision.decided_by == "webhook:fleet/fleet-bot"
    assert broker.get_request(approve.id).status is Status.approved
    assert broker.get_request(reject.id).decision.reason == REJECT_REASON
    assert broker.get_request(ignore.id).status is Status.pending
    assert broker.get_request(taken.id).status is Status.rejected  # alice was first
    answered = {rid: (a.status, a.final_status) for rid, a in receiver.answered.items()}
    assert answered == {
        approve.id: (200, "approved"),
        reject.id: (200, "rejected"),
        taken.id: (409, "rejected"),
    }
    stats = receiver.stats()
    assert [stats.get(k) for k in ("redelivered", "ignored", "bad_signature")] == [1, 1, 1]
    assert receiver.answered[approve.id].tries >= 2  # the dead API was tried first
    assert receiver.failures == []
