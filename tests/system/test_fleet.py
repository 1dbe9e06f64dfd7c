"""Issue 8: a horizontally scaled fleet holds under faults.

A real fleet of separate OS processes on one Redis with AOF: 2 API processes, 3 notifiers,
2 agent workers (each advancing up to 50 runs at once, `--no-resumer`), 2 sweepers and the resumer. The test
process is the app and the people: it starts runs of the demo refunds agent (each run for a
customer of its own, so each has its own order to refund), and a webhook receiver
(`tests/support/fakes/deciding_receiver.py`) approves, rejects or ignores each approval request it is
sent, replying through the signed `/v1/webhooks/{name}/replies` of either API process. Ignored
requests time out through the sweepers.

Every TG_EVERY-th run is of the same demo agent registered under a second name whose requests
go to a queue whose channel is Telegram (`telegram:fleet`, on a fake Bot API). There a person,
`tg-ann` (`tests/support/fakes/telegram_person.py`), watches the chat for the bot's cards and decides
them by the same mix: presses Approve, presses Reject and answers the bot's ForceReply prompt
with the reason, or stays silent; each update goes to `/v1/telegram/updates` of either API
process, sent again while an API is down.

Meanwhile a role process is SIGKILLed (with the processes below it, if any) every few seconds and
restarted, the roles taking turns so that each is killed (only the timing and which process of
a role are random; `tests/support/fleet_processes.py`), and Redis itself is SIGKILLed once and started
again on the same port and data directory (it fsyncs every write before it answers, so every
run the app started is still there). A process that dies on its own is restarted too, and
fails the test. The harness heals nothing else: when no run finishes for STALL_S while the
fleet drains, each open run's cause is named (`tests/support/fleet_stalls.py`: a job a SIGKILLed
worker took and never started, a retry's back-off, a job abandoned on a killed worker), and a
run without one fails the test.

At the end (`tests/support/fleet_checks.py`): every run finished, or failed for a reason on a short list
(a worker killed mid-step), no more runs failed than workers were SIGKILLed; every request has
exactly one outcome (one outcome event in its stream, one at the webhook, none pending), and it
is what the receiver meant: approve -> approved, reject -> rejected with its reason, both
decided by the endpoint, silence -> timed out by the sweeper; the one allowed exception is a
reply that landed after its request expired, and the sweeper's time proves it. The Telegram
requests likewise (`tests/support/fleet_telegram_checks.py`): one outcome event each, what tg-ann meant,
decided by tg-ann, and a card in the chat edited to show it. No round resumed
twice (a live wait went on with it or one RQ resume job did, never both); no tool step ran twice: the ledger counts exactly
one refund attempt for each approved call of a finished run, at most one for a failed run, none
when not approved; every role was SIGKILLed; the outbox is empty; every dead letter has a cause.
The counts are printed and written to `fleet-counts.txt` in the test's tmp dir.

Knobs (environment): APPROVAL_BROKER_FLEET_RUNS (default 500; each role is still SIGKILLed at
least once, a short run goes on killing until each had its turn, and Redis once, as in a longer
run; 2000 for a soak), APPROVAL_BROKER_FLEET_KILL_EVERY_S
(default 4; 0 disables the kills), APPROVAL_BROKER_FLEET_INFLIGHT (default 120 unfinished runs).
"""

from __future__ import annotations

import base64
import json
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from redis import Redis
from redis.exceptions import RedisError
from refunds_demo import AGENT_NAME, register_demo
from refunds_demo.runs import AGENT_PATH, DEPS_PATH
from standardwebhooks import Webhook

from api.app import create_app
from api.testing import ServerThread as ApiServer
from broker.domain.config import load_config, parse_config
from broker.domain.models import Decision, NewRequest, Request, RunStatus, Status
from broker.domain.settings import Settings
from broker.facade import Broker
from broker.redis.embedded import EmbeddedRedis, free_port
from broker.runs.agents import register_agent
from broker.runs.starting import start_run
from broker.store.keys import NOTIFIER_GROUP
from tests.support.fakes.deciding_receiver import Answered, DecidingReceiver, Intent, mix_policy
from tests.support.fakes.harness import running
from tests.support.fakes.telegram import FakeTelegram
from tests.support.fakes.telegram_person import TelegramPerson
from tests.support.fleet_checks import (
    BOT,
    BY_WEBHOOK,
    ENDPOINT,
    FINAL,
    LATE,
    REJECT_REASON,
    Started,
    all_request_ids,
    check,
    group_pending,
    judge,
    outbox_left,
)
from tests.support.fleet_processes import ROLES, Events, Fleet
from tests.support.fleet_stalls import Stalls
from tests.support.fleet_telegram_checks import check_telegram, shows_outcome
from tests.support.waiting import wait_for

RUNS = int(os.environ.get("APPROVAL_BROKER_FLEET_RUNS", "500"))
KILL_EVERY_S = float(os.environ.get("APPROVAL_BROKER_FLEET_KILL_EVERY_S", "4"))
MAX_INFLIGHT = int(os.environ.get("APPROVAL_BROKER_FLEET_INFLIGHT", "120"))
MIX = {"approve": 5, "reject": 3, "ignore": 2}
QUEUE_TIMEOUT_S = 4
PREFIX = "fleet:"
SECRET = "whsec_" + base64.b64encode(b"fleet-test-secret-0123456789abcd").decode()
DRAIN_BUDGET_S = 360.0  # a loaded machine (other test runs) needed more than 240 s once
STALL_S = 20.0
"""No run finished for this long in the drain: each open run's cause is named (`Stalls`)."""
ABANDONED_AFTER_S = 10
"""A SIGKILLed worker's runs are retried this long after its last heartbeat (plus at most half
of it until a live worker's recovery pass), not the default 30 s: the drain is shorter."""
TG_EVERY = 5
"""Every TG_EVERY-th run asks in Telegram (the others at the webhook)."""
TG_AGENT = f"{AGENT_NAME}-telegram"
"""The demo agent under a second name, whose requests go to TG_QUEUE."""
TG_QUEUE = "telegram"
TG_APPROVER = "tg-ann"
TG_USER_ID = 424242
TG_CHAT_ID = -1004242424242
TG_SECRET = "fleet-telegram-webhook-secret-0123456789"


# ---- the app: starting runs, following them ---------------------------------------------------


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

    def snapshot(self) -> set[str]:
        with self.lock:
            return set(self.open)

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
            done = {  # final, or gone (lost by Redis: `check` reports it)
                rid
                for rid, status in zip(ids, pipe.execute(), strict=True)
                if status is None or RunStatus(status.decode()) in FINAL
            }
            if done:
                with self.lock:
                    self.open -= done
                self.last_change = time.monotonic()
        with self.lock:
            return len(self.open)


def prompt_for(i: int) -> tuple[str, int]:
    # above the $50 auto-refund limit (and the demo rule's $60), at most the $150 above which the
    # demo asks two approvers: one signed reply decides each request
    amount = 61 + (i * 7) % 89
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
        agent = TG_AGENT if i % TG_EVERY == TG_EVERY - 1 else AGENT_NAME
        with gate_lock:
            try:
                run = start_run(broker, agent, prompt, deps={"customer": customer})
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


# ---- the test ---------------------------------------------------------------------------------


@pytest.fixture
def fleet_redis(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    """The fleet's own Redis (AOF on, fsynced before each answer: the default), which the test
    SIGKILLs and restarts."""
    server = EmbeddedRedis(tmp_path / "redis").start()
    client = Redis.from_url(server.url)
    assert client.config_get("appendfsync") == {"appendfsync": "always"}
    client.close()
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
        endpoint=ENDPOINT,
        policy=policy,
        decided_by=BOT,
        threads=8,
    ).start()
    telegram = FakeTelegram().start()
    config_path = tmp_path / "fleet.toml"
    config_path.write_text(
        f"""
[workers]
abandoned_after_s = {ABANDONED_AFTER_S}

[queues.default]
channels = ["webhook:{ENDPOINT}"]
timeout_s = {QUEUE_TIMEOUT_S}

[webhooks.{ENDPOINT}]
url = "{receiver.url("/hook")}"
secret = "{SECRET}"
roles = ["ops"]
max_attempts = 30
backoff_s = 0.05
max_backoff_s = 1.0
timeout_s = 5

[queues.{TG_QUEUE}]
channels = ["telegram:fleet"]
timeout_s = {QUEUE_TIMEOUT_S}
roles = ["support"]

[telegram]
bot_token = "{telegram.token}"
webhook_secret = "{TG_SECRET}"
api_base_url = "{telegram.url}"

[telegram.chats.fleet]
chat_id = {TG_CHAT_ID}

[approvers.{TG_APPROVER}]
roles = ["support"]
telegram_user_id = {TG_USER_ID}
"""
    )
    redis = Redis.from_url(fleet_redis.url)
    broker = Broker(redis, load_config(config_path), prefix=PREFIX)
    register_demo(broker)
    register_agent(broker, TG_AGENT, AGENT_PATH, deps=DEPS_PATH, queue=TG_QUEUE)

    def status_of(rid: str) -> tuple[str, str | None]:
        """What became of a request (the person asks when the bot's answer was lost)."""
        deadline = time.monotonic() + 90
        while True:
            try:
                request = broker.get_request(rid)
            except RedisError:  # Redis is being restarted: ask again
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
                continue
            decision = request.decision
            return request.status.value, decision.decided_by if decision else None

    person = TelegramPerson(
        telegram,
        [f"http://127.0.0.1:{p}" for p in api_ports],
        secret=TG_SECRET,
        user_id=TG_USER_ID,
        policy=policy,
        status_of=status_of,
    ).start()
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
    stalls = Stalls()
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
        if KILL_EVERY_S > 0:  # a short run goes on killing until each role had its turn
            wait_until(
                fleet.killed_every_role,
                KILL_EVERY_S * 1.5 * len(ROLES) + 30,
                "roles were not all killed",
            )
        fleet.calm()  # no more kills: the rest must finish on its own
        times["every role killed"] = time.monotonic() - t0

        # drain: a live worker's recovery pass (every ABANDONED_AFTER_S / 2) retries the jobs
        # a killed worker was running once their heartbeat ran out, and the ones it had taken
        # but not started (RQ's intermediate queue) a minute after a pass first saw them. The
        # harness heals nothing: when no run finishes for STALL_S, each open run's cause is
        # named (tests/support/fleet_stalls.py), and one without a cause fails the test.
        deadline = time.monotonic() + DRAIN_BUDGET_S
        while tracker.poll():
            if time.monotonic() > deadline:
                break
            if time.monotonic() - tracker.last_change > STALL_S:
                stalls.note(broker, tracker.snapshot(), fleet.events.killed_pids["worker"])
                tracker.last_change = time.monotonic()
            time.sleep(0.5)
        times["all runs final"] = time.monotonic() - t0

        # the outcome events reach the webhook too
        request_ids = all_request_ids(broker, started)

        tg_requests = [r for r in broker.get_requests(request_ids) if r.queue == TG_QUEUE]

        def delivered() -> bool:
            pending = sum(
                group_pending(redis, broker.keys.stream(q), NOTIFIER_GROUP)
                for q in ("default", TG_QUEUE)
            )
            # both outboxes, as `check` counts them: an entry a live job's round left in
            # `resumes_direct` is acknowledged by a resumer (after its grace, or, if the
            # resumer that read it was killed, once reclaimed)
            resumes = outbox_left(broker) != (0, 0)
            tg_ids = {r.id for r in tg_requests}
            return (
                not pending
                and not resumes
                and all(r in receiver.outcomes for r in request_ids if r not in tg_ids)
                and all(shows_outcome(telegram, r) for r in tg_requests)
            )

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
        person.stop()
        telegram.stop()

    events = fleet.events
    found = check(broker, receiver, started, events, kills_planned=KILL_EVERY_S > 0)
    check_telegram(found, broker, telegram, person, queue=TG_QUEUE, approver=TG_APPROVER)
    found.counts["faults"] = {
        "SIGKILLs by kind": dict(events.kills),
        "Redis restart": f"SIGKILLed at run {events.redis_restarted_at_run}, "
        f"back after {events.redis_down_s:.2f} s",
        "died on their own (each one fails the test)": len(events.self_deaths),
        f"drain stalls (no run finished for {STALL_S:.0f} s)": stalls.count,
        "open runs in those stalls, by cause": dict(stalls.causes),
        "app start_run errors": len(events.start_errors),
    }
    found.bad("open runs in a drain stall without a named cause (a liveness bug)", stalls.unnamed)
    found.counts["seconds"] = {k: round(v, 1) for k, v in times.items()}
    found.counts["cpu seconds (processes alive at the end)"] = cpu
    report = "fleet test counts\n" + json.dumps(found.counts, indent=2)
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
    intents = {rid: i.action for rid, i in receiver.intents.items()}
    assert intents == {approve.id: "approve", reject.id: "reject", ignore.id: "silent", taken.id: "approve"}  # fmt: skip
    assert receiver.intents[ignore.id].expires_at == ignore.expires_at.timestamp()
    assert all(a.sent_at <= a.at for a in receiver.answered.values())
    stats = receiver.stats()
    assert [stats.get(k) for k in ("redelivered", "ignored", "bad_signature")] == [1, 1, 1]
    assert receiver.answered[approve.id].tries >= 2  # the dead API was tried first
    assert receiver.failures == []


def test_telegram_person_clicks_each_card_once_through_a_live_api(redis_url: str) -> None:
    telegram = FakeTelegram().start()
    config = parse_config(
        {
            "queues": {TG_QUEUE: {"channels": ["telegram:fleet"], "roles": ["support"]}},
            "telegram": {
                "bot_token": telegram.token,
                "webhook_secret": TG_SECRET,
                "api_base_url": telegram.url,
                "chats": {"fleet": {"chat_id": TG_CHAT_ID}},
            },
            "approvers": {TG_APPROVER: {"roles": ["support"], "telegram_user_id": TG_USER_ID}},
        }
    )
    broker = Broker(Redis.from_url(redis_url), config, prefix="t:")
    approve, reject, ignore = (
        broker.create_request(NewRequest(tool_name="refund", args={"n": n}, queue=TG_QUEUE))
        for n in range(3)
    )
    plan = {approve.id: {"outcome": "approved"}}
    plan[reject.id] = {"outcome": "rejected", "reason": REJECT_REASON}
    app = create_app(Settings(redis_url=redis_url, key_prefix="t:"), config, broker)
    with ApiServer(app) as api, running(broker):
        # the first API "process" is down: every update moves on to the live one
        person = TelegramPerson(
            telegram,
            [f"http://127.0.0.1:{free_port()}", api.url],
            secret=TG_SECRET,
            user_id=TG_USER_ID,
            policy=lambda request: plan.get(request["id"]),
            status_of=lambda rid: ("pending", None),
        ).start()
        try:
            wait_for(lambda: len(person.answered) == 2 and len(person.intents) == 3)
            done = [r for r in broker.get_requests([approve.id, reject.id]) if not r.is_pending]
            wait_for(lambda: all(shows_outcome(telegram, r) for r in done) and len(done) == 2)
        finally:
            person.stop()
            telegram.stop()

    approved, rejected = broker.get_request(approve.id), broker.get_request(reject.id)
    assert approved.status is Status.approved and rejected.status is Status.rejected
    assert approved.decision and approved.decision.decided_by == TG_APPROVER
    assert rejected.decision and rejected.decision.decided_by == TG_APPROVER
    assert rejected.decision.reason == REJECT_REASON  # the reply to the bot's ForceReply prompt
    assert broker.get_request(ignore.id).is_pending
    intents = {rid: i.action for rid, i in person.intents.items()}
    assert intents == {approve.id: "approve", reject.id: "reject", ignore.id: "silent"}
    answered = {rid: (a.status, a.final_status) for rid, a in person.answered.items()}
    assert answered == {approve.id: (200, "approved"), reject.id: (200, "rejected")}
    assert person.failures == []
    assert person.stats()["updates sent again (API down or 5xx)"] >= 1  # the dead API first


def test_judge_allows_only_a_reply_that_landed_after_expiry_to_lose_to_the_sweeper() -> None:
    t = 1_000_000.0
    at = datetime.fromtimestamp

    def request(status: str, by: str, decided_at: float, reason: str | None = None) -> Request:
        outcome = {"timed_out": "rejected"}.get(status, status)
        decision = Decision(outcome=outcome, reason=reason, decided_by=by, decided_at=at(decided_at, UTC))  # fmt: skip
        return Request(id="r", tool_call_id="c", tool_name="t", args_hash="h", created_at=at(t - 4, UTC), expires_at=at(t, UTC), status=Status(status), decision=decision)  # fmt: skip

    approve = Intent("r", "approve", {"outcome": "approved"}, t, t - 4)
    silent = Intent("r", "silent", None, t, t - 4)
    reject = Intent("r", "reject", {"outcome": "rejected", "reason": REJECT_REASON}, t, t - 4)
    landed = Answered("r", "approved", 200, "approved", 1, sent_at=t - 3, at=t - 2.9)
    timed_out = Answered("r", "approved", 409, "timed_out", 2, sent_at=t + 0.5, at=t + 0.6)
    in_flight = Answered("r", "approved", 409, "timed_out", 1, sent_at=t - 0.1, at=t + 0.6)
    early = Answered("r", "approved", 409, "timed_out", 1, sent_at=t - 3, at=t - 2.9)
    retried = Answered("r", "approved", 409, "approved", 2, sent_at=t - 2, at=t - 1.9)
    refused = Answered("r", "rejected", 200, "rejected", 1, sent_at=t - 3, at=t - 2.9)

    assert judge(request("approved", BY_WEBHOOK, t - 2.95), approve, landed) is None
    assert judge(request("timed_out", "sweeper", t + 0.1), silent, None) is None
    assert judge(request("rejected", BY_WEBHOOK, t - 2.95, REJECT_REASON), reject, refused) is None
    assert judge(request("approved", BY_WEBHOOK, t - 2.95), approve, retried) is None  # own 1st try
    assert judge(request("timed_out", "sweeper", t + 0.1), approve, timed_out) == LATE[0]
    assert judge(request("timed_out", "sweeper", t + 0.1), approve, in_flight) == LATE[1]
    # each of these is a bug the fleet test must report
    assert judge(request("timed_out", "sweeper", t - 3), approve, early)  # swept before expiry
    assert judge(request("timed_out", "sweeper", t + 1), approve, timed_out)  # swept after the 409
    assert judge(request("timed_out", "sweeper", t + 0.1), approve, landed)  # a 200 lost
    assert judge(request("approved", "alice", t - 2.95), approve, landed)  # someone else
    assert judge(request("rejected", BY_WEBHOOK, t - 2.95, "other"), reject, refused)
    assert judge(request("approved", BY_WEBHOOK, t - 2.95), silent, None)  # never sent
    assert judge(request("timed_out", "sweeper", t + 0.1), silent, landed)  # sent anyway
    assert judge(request("approved", BY_WEBHOOK, t - 2.95), reject, landed)
