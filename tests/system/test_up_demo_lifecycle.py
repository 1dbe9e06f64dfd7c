"""`up --demo`, `up` and `up --demo --fresh` one after another on one data dir, as a user
repeats the walkthrough: the demo's agent and rule exist only while `up` runs with `--demo`, and
`--fresh` gives the walkthrough back what an earlier one used up (order A103's refund). Also:
the banner names the config and what it loaded, and the roles are quiet unless `--verbose`."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import refunds_demo

from approval_broker.up import FRESH_NEEDS_EMBEDDED, banner, loaded_lines
from broker.domain.config import parse_config
from broker.domain.errors import NotFound
from broker.domain.settings import Settings
from broker.facade import Broker
from broker.redis.embedded import free_port
from broker.runs.agents import agent_spec, register_agent
from tests.support.up import ADMIN, healthy, start_up, up_command
from tests.support.waiting import wait_for

RULE = refunds_demo.RULE_DEMO["id"]


@contextmanager
def live_up(data_dir: Path, *extra: str) -> Iterator[tuple[httpx.Client, list[str]]]:
    """`up` with `extra` on `data_dir` until the block ends; then `out[0]` holds all it printed."""
    proc, url = start_up(data_dir, *extra)
    out: list[str] = []
    try:
        wait_for(lambda: healthy(url) or proc.poll() is not None, timeout=120)
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        headers = {"Authorization": f"Bearer {ADMIN}"}
        with httpx.Client(base_url=url, headers=headers, timeout=10) as http:
            yield http, out
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # Ctrl-C, as a user stops it
            out.append(proc.communicate(timeout=240)[0])  # a busy machine stops slowly
        assert proc.returncode == 0, out


def pending(http: httpx.Client) -> list[dict]:
    return http.get("/v1/requests", params={"status": "pending"}).json()


@pytest.mark.timeout(900)  # three `up`s one after another; each starts slowly on a busy machine
def test_demo_state_lives_only_with_demo_and_fresh_gives_the_walkthrough_back(
    tmp_path: Path,
) -> None:
    with live_up(tmp_path, "--demo", "--verbose") as (http, out):
        waiting = wait_for(lambda: len(pending(http)) == 3 and pending(http), timeout=180)
        [a103] = [r for r in waiting if r["args"].get("order_id") == "A103"]
        decided = http.post(f"/v1/requests/{a103['id']}/decision", json={"outcome": "approved"})
        assert decided.status_code == 200, decided.text
        run = wait_for(
            lambda: (
                (r := http.get(f"/v1/runs/{a103['run_id']}").json())["status"] == "finished" and r
            ),
            timeout=60,
        )
        assert run["output"]["refunded"] is True  # A103 is used up in the demo's ledger
    assert "Job OK" in out[0]  # --verbose: RQ's line per job

    with live_up(tmp_path) as (http, out):
        started = http.post("/v1/runs", json={"agent": "refunds", "prompt": "Refund A101"})
        assert started.status_code == 422 and started.json()["error"] == "unknown_agent"
        assert http.get(f"/v1/rules/{RULE}").json()["revoked_at"] is not None
    assert "[up] no --demo: withdrew the demo's agent refunds" in out[0]
    assert f"[up] no --demo: withdrew the demo's rule {RULE}" in out[0]
    assert "  agents       none\n" in out[0] and "  rules        none\n" in out[0]
    assert "demo runs" not in out[0]
    assert "rq.worker" not in out[0] and "Acquired scheduler lock" not in out[0]  # quiet

    with live_up(tmp_path, "--demo", "--fresh") as (http, out):
        waiting = wait_for(lambda: len(pending(http)) == 3 and pending(http), timeout=180)
        assert [r["args"]["amount"] for r in waiting if r["args"].get("order_id") == "A103"] == [
            120
        ]  # asked again, not refused as already refunded
        approved = wait_for(
            lambda: http.get("/v1/requests", params={"status": "approved"}).json(), timeout=60
        )
        assert [r["decision"]["decided_by"] for r in approved] == [f"rule:{RULE}"]  # none older
        assert http.get(f"/v1/rules/{RULE}").json()["revoked_at"] is None
    assert "[up] --fresh: the embedded Redis starts empty" in out[0]
    assert "  agents       refunds (demo)\n" in out[0]


def test_fresh_is_refused_on_a_redis_up_does_not_run(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPROVAL_BROKER_")}
    env.update(APPROVAL_BROKER_ADMIN_TOKEN=ADMIN, APPROVAL_BROKER_REDIS_URL="redis://127.0.0.1:1/0")
    done = subprocess.run(
        up_command(free_port(), tmp_path, "--demo", "--fresh"),
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.strip() == f"error: {FRESH_NEEDS_EMBEDDED}"


def test_withdrawing_the_demo_keeps_a_users_own_refunds_agent(broker: Broker) -> None:
    register_agent(broker, "refunds", "myapp.agents:refunds_agent")
    refunds_demo.add_demo_rule(broker)
    assert refunds_demo.withdraw_demo(broker) == [f"rule {RULE}"]
    assert agent_spec(broker, "refunds").path == "myapp.agents:refunds_agent"


def test_a_withdrawn_demo_rule_is_made_anew_by_the_next_demo(broker: Broker) -> None:
    refunds_demo.register_demo(broker)
    refunds_demo.add_demo_rule(broker)
    assert refunds_demo.withdraw_demo(broker) == ["agent refunds", f"rule {RULE}"]
    with pytest.raises(NotFound):
        agent_spec(broker, "refunds")
    refunds_demo.register_demo(broker)
    refunds_demo.add_demo_rule(broker)
    rule = broker.requests.rules.get(RULE)
    assert rule.revoked_at is None and rule.created_by == "demo"


def test_the_banner_names_the_config_file_and_what_it_defines(tmp_path: Path) -> None:
    config = parse_config(
        {
            "queues": {
                "default": {"channels": ["inbox"]},
                "managers": {"channels": ["inbox", "webhook:ops"]},
            },
            "webhooks": {
                "ops": {
                    "url": "https://ops.example/hook",
                    "secret": "whsec_dGVzdC1zZWNyZXQtZm9yLXRoZS1vcHMtd2ViaG9vayE=",
                }
            },
            "agents": {"billing": {"path": "myapp.agents:billing"}},
            "rules": [{"id": "small", "effect": "allow", "tool": "refund"}],
        }
    )
    settings = Settings(redis_url="redis://x", config=tmp_path / "approval-broker.toml")
    lines = loaded_lines(settings, config, demo_agent=refunds_demo.AGENT_NAME, demo_rule=RULE)
    assert lines == [
        f"  config       {tmp_path / 'approval-broker.toml'}",
        "  queues       default, managers",
        "  channels     inbox, webhook:ops",
        "  agents       billing, refunds (demo)",
        f"  rules        small, {RULE} (demo)",
    ]
    text = banner(settings, "t", False, [], loaded=lines)
    assert all(line in text for line in lines)
    assert "Roles log warnings only (`up --verbose` for everything)" in text
    assert "Roles log everything (--verbose)" in banner(settings, "t", False, [], verbose=True)


def test_a_bad_log_level_is_one_line_and_no_start(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPROVAL_BROKER_")}
    env.update(APPROVAL_BROKER_ADMIN_TOKEN=ADMIN, APPROVAL_BROKER_LOG_LEVEL="loud")
    done = subprocess.run(
        up_command(free_port(), tmp_path), env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "error: APPROVAL_BROKER_LOG_LEVEL: Input should be 'DEBUG', 'INFO', 'WARNING' or 'ERROR'"
    )
