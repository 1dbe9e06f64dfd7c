"""The notifier as a fleet of real processes: `approval-broker notifier`, killed with SIGKILL
mid-delivery (or with deliveries parked), and another process finishing its work."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis import Redis

from broker.domain.config import load_config
from broker.domain.models import NewRequest
from broker.facade import Broker
from broker.store.keys import NOTIFIER_GROUP
from notifiers.parking import ParkedStore
from tests.support.fakes.harness import SECRET
from tests.support.fakes.slack import FakeSlack
from tests.support.fakes.webhook_receiver import WebhookReceiver
from tests.support.notifier_setup import settled
from tests.support.waiting import wait_for

CLI = str(Path(sys.executable).parent / "approval-broker")
N = 30


@pytest.fixture
def fakes() -> Iterator[tuple[WebhookReceiver, FakeSlack]]:
    receiver = WebhookReceiver(SECRET).start()
    slack = FakeSlack().start()
    slack.delay["chat.postMessage"] = 0.15  # slow enough to be killed in the middle
    yield receiver, slack
    slack.stop()
    receiver.stop()


class Fleet:
    def __init__(self, redis_url: str, config: Path, logs: Path) -> None:
        self.env = {
            **os.environ,
            "APPROVAL_BROKER_REDIS_URL": redis_url,
            "APPROVAL_BROKER_CONFIG": str(config),
            "APPROVAL_BROKER_KEY_PREFIX": "t:",
            "APPROVAL_BROKER_NOTIFIER_CLAIM_IDLE_S": "1",
            "APPROVAL_BROKER_NOTIFIER_BLOCK_MS": "100",
            "APPROVAL_BROKER_NOTIFIER_WORKERS": "4",
            # a posting claim is honoured 3 x 1 + 5 s: then the survivor looks for the post
            "APPROVAL_BROKER_NOTIFIER_SLACK_TIMEOUT_S": "1",
        }
        self.logs = logs
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, **env: str) -> subprocess.Popen[bytes]:
        out = self.logs / f"{name}.log"
        with out.open("wb") as sink:
            process = subprocess.Popen(
                [CLI, "notifier"],
                env={**self.env, "APPROVAL_BROKER_NOTIFIER_NAME": name, **env},
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
        self.processes.append(process)
        wait_for(  # a process start: seconds of imports, more on a busy machine
            lambda: f"notifier {name} reading queues default".encode() in out.read_bytes(),
            timeout=60,
        )
        return process

    def output(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text()

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait(10)


def redis_owners(broker: Broker) -> dict[str, int]:
    """Unacknowledged entries per consumer."""
    summary = broker.redis.xpending(broker.keys.stream("default"), NOTIFIER_GROUP)
    return {c["name"].decode(): int(c["pending"]) for c in summary["consumers"]}


def write_config(
    directory: Path, receiver: WebhookReceiver, slack: FakeSlack, channels: list[str]
) -> Path:
    """The notifier processes' TOML: the default queue on these channels, pointing at the fakes."""
    path = directory / "approval-broker.toml"
    path.write_text(
        f"""
[queues.default]
channels = {json.dumps(channels)}

[webhooks.ops]
url = "{receiver.url("/ops")}"
secret = "{SECRET}"

[slack]
bot_token = "{slack.token}"
signing_secret = "unused"
api_base_url = "{slack.url}"
[slack.channels.approvals]
channel = "C1"
"""
    )
    return path


@pytest.mark.timeout(120)
def test_sigkilled_notifier_is_finished_by_another_without_skips_or_double_posts(
    redis_url: str, tmp_path: Path, fakes: tuple[WebhookReceiver, FakeSlack]
) -> None:
    receiver, slack = fakes
    config_path = write_config(
        tmp_path, receiver, slack, ["inbox", "webhook:ops", "slack:approvals"]
    )
    broker = Broker(Redis.from_url(redis_url), load_config(config_path), prefix="t:")
    state = broker.deliveries
    fleet = Fleet(redis_url, config_path, tmp_path)
    try:
        first = fleet.start("n1")
        ids = [
            broker.create_request(NewRequest(tool_name="refund", args={"n": i})).id
            for i in range(N)
        ]

        def posted() -> set[str]:
            return {r for r in ids if state.post_state(r, "slack:approvals").posted}

        wait_for(lambda: len(posted()) >= 5)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        posted_before = posted()
        assert len(posted_before) < N, "n1 finished everything before it could be killed"
        owners = redis_owners(broker)
        assert owners.get("n1", 0) > 0, "n1 left nothing unacknowledged to take over"

        second = fleet.start("n2")
        wait_for(lambda: settled(broker), timeout=60)
        second.send_signal(signal.SIGTERM)
        assert second.wait(20) == 0
        assert "notifier n2 stopping" in fleet.output("n2")
    finally:
        fleet.close()

    # no request skipped: every one reached the webhook and Slack
    accepted = receiver.accepted("/ops")
    assert {d.payload["data"]["id"] for d in accepted} == set(ids)
    assert len({d.id for d in accepted}) == N  # a redelivery reuses its webhook-id
    assert all(slack.posts_for(r) for r in ids)
    # a message recorded as posted is never posted again, and the posts in flight at the
    # moment of the kill are found (by their metadata) rather than posted twice
    assert all(len(slack.posts_for(r)) == 1 for r in posted_before)
    assert [len(slack.posts_for(r)) for r in ids] == [1] * N
    assert not broker.dead_letters()


@pytest.mark.timeout(120)
def test_parked_deliveries_outlive_a_sigkilled_notifier(
    redis_url: str, tmp_path: Path, fakes: tuple[WebhookReceiver, FakeSlack]
) -> None:
    """Slack rate-limits, n1 parks the Slack deliveries and acks their entries, then is killed:
    n2 posts each request exactly once, from the parked store or the reclaimed entries."""
    receiver, slack = fakes
    slack.fail("chat.postMessage", 429, error="ratelimited", retry_after=3, times=4)
    config_path = write_config(tmp_path, receiver, slack, ["webhook:ops", "slack:approvals"])
    broker = Broker(Redis.from_url(redis_url), load_config(config_path), prefix="t:")
    store = ParkedStore(broker, lease_s=1)
    fleet = Fleet(redis_url, config_path, tmp_path)
    n = 8
    try:
        first = fleet.start(
            "n1",
            APPROVAL_BROKER_NOTIFIER_MAX_INFLIGHT="3",
            APPROVAL_BROKER_NOTIFIER_PARK_AFTER_S="0.2",
        )
        ids = [
            broker.create_request(NewRequest(tool_name="refund", args={"n": i})).id
            for i in range(n)
        ]
        wait_for(lambda: len(receiver.accepted("/ops")) == n)
        # beyond max_inflight, entries were acked with their Slack share parked
        wait_for(lambda: store.count("slack:approvals") >= n - 3)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        assert not slack.calls_to("chat.postMessage", ok_only=True)  # Slack still paused
        assert sum(redis_owners(broker).values()) <= 3

        second = fleet.start("n2")
        # n2's start, its reclaim of n1's entries and Slack's retry_after all come first: on a
        # loaded CI machine that took over 30 s once
        wait_for(lambda: all(slack.posts_for(r) for r in ids), timeout=60)
        wait_for(lambda: store.count("slack:approvals") == 0 and settled(broker))
        second.send_signal(signal.SIGTERM)
        assert second.wait(20) == 0
    finally:
        fleet.close()
    assert [len(slack.posts_for(r)) for r in ids] == [1] * n
    assert {d.payload["data"]["id"] for d in receiver.accepted("/ops")} == set(ids)
    assert not broker.dead_letters()
