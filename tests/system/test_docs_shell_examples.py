"""Every shell and curl example in README.md and docs/*.md runs as written against a live
`approval-broker up --demo --fresh`, or is run by a named test elsewhere, or is skipped here
with the reason it can't run locally. A new example that is none of these fails
`test_every_shell_example_is_run_or_skipped_for_a_reason`: no example is left unchecked silently.

"As written" allows only what a reader changes too: `localhost:8000` becomes the live `up`'s
address, `TOKEN=...` the admin token, a placeholder (`REQ_ID`, `REQ_1`, `RULE_ID`)
the id an earlier step printed, and `uv run approval-broker` the same command of this
environment.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from broker.redis.embedded import free_port
from tests.support.docs_examples import ROOT, blocks, page
from tests.support.up import ADMIN, healthy, stop_up
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(600)  # the first test also waits for the live `up` to start

SHELL = ("sh", "bash", "shell", "console")
COMMAND = re.compile(r"\s*(?:\$ )?(?:uv run )?(?:approval-broker|curl) ")
"""An untagged block whose first line is a command is a shell example too."""


@dataclass(frozen=True)
class Example:
    page: str
    line: int
    text: str

    @property
    def key(self) -> tuple[str, str]:
        """(page, first command line): how the lists below name an example."""
        first = next(
            line.strip()
            for line in self.text.splitlines()
            if line.strip() and not line.strip().startswith("#")
        )
        return self.page, first.removeprefix("$ ")


def examples() -> list[Example]:
    """Fenced blocks tagged as shell, and untagged ones holding an approval-broker or curl
    command first, of README.md and every docs page."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text()
        name = str(path.relative_to(ROOT))
        for m in re.finditer(r"^[ \t]*```([^\n]*)\n(.*?)^[ \t]*```", text, flags=re.S | re.M):
            lang, body = m.group(1).strip(), m.group(2)
            if lang in SHELL or (not lang and COMMAND.match(body)):
                found.append(Example(name, text[: m.start()].count("\n") + 1, body))
    return found


def example(page: str, first: str) -> Example:
    [found] = [e for e in examples() if e.key == (page, first)]
    return found


# ---- where each example is checked ---------------------------------------------------------

RUN_HERE = {
    ("docs/walkthrough.md", "uv run approval-broker up --demo --fresh"): "the `live` fixture",
    ("docs/walkthrough.md", "uv run approval-broker pending              # one line per request, its id first"): "test_the_walkthrough_shell_step",
    ("docs/walkthrough.md", "TOKEN=...   # the admin token from the banner, or an approver's token"): "test_the_walkthrough_http_step",
    ("docs/policy-rules.md", "approval-broker rules add --effect allow --tool refund --agent refunds --args '{\"amount\": {\"le\": 100}}'"): "test_the_rules_commands",
    ("docs/policy-rules.md", "curl -s -X POST localhost:8000/v1/requests/REQ_ID/decision -H \"Authorization: Bearer $TOKEN\" \\"): "test_remembering_a_rule_from_a_decision",
    ("docs/policy-rules.md", "approval-broker rules replay --since 2026-11-01"): "test_the_replay_console",
    ("docs/http-api.md", "curl -si \"localhost:8000/v1/requests?status=pending&queue=managers&limit=50\" -H \"Authorization: Bearer $TOKEN\" | grep -i '^link'"): "test_the_next_page_link",
    ("docs/remote-agents.md", "TOKEN=...   # a token with the requester role"): "test_the_remote_agents_curl_calls",
    ("docs/audit.md", "approval-broker audit export --since 2026-12-01 --until 2026-12-02 -o day.jsonl"): "test_the_audit_export_and_verify_console",
}  # fmt: skip

ELSEWHERE = {
    ("README.md", "uv init --package myapp && cd myapp"): "tests/system/test_own_project.py::test_readme_quickstart_2_runs_in_a_project_of_ones_own",
    ("README.md", "APPROVAL_BROKER_CONFIG=approval-broker.toml uv run approval-broker up"): "tests/system/test_own_project.py::test_readme_quickstart_2_runs_in_a_project_of_ones_own",
    ("README.md", "uv build --wheel --out-dir dist && uv build --wheel --out-dir dist clients/python   # in the clone"): "tests/system/test_own_project.py::test_readme_quickstart_2_runs_in_a_project_of_ones_own",
    ("docs/index.md", "uv init --package myapp && cd myapp"): "tests/system/test_own_project.py::test_readme_quickstart_2_runs_in_a_project_of_ones_own",
    ("docs/index.md", "APPROVAL_BROKER_CONFIG=approval-broker.toml uv run approval-broker up"): "tests/system/test_own_project.py::test_readme_quickstart_2_runs_in_a_project_of_ones_own",
    ("docs/index.md", "uv build --wheel --out-dir dist && uv build --wheel --out-dir dist clients/python   # in the clone"): "tests/system/test_own_project.py::test_readme_quickstart_2_runs_in_a_project_of_ones_own",
    ("README.md", "uv run approval-broker up        # every role on an embedded Redis; inbox at http://127.0.0.1:8000"): "tests/system/test_up.py::test_up_runs_an_approval_and_stops_cleanly",
    ("docs/index.md", "uv run approval-broker up        # every role on an embedded Redis; inbox at http://127.0.0.1:8000"): "tests/system/test_up.py::test_up_runs_an_approval_and_stops_cleanly",
    ("docs/slack.md", "approval-broker config check approval-broker.toml"): "tests/system/test_channel_setup_pages.py::test_each_setup_pages_config_check_prints_what_the_page_shows",
    ("docs/teams.md", "approval-broker config check approval-broker.toml"): "tests/system/test_channel_setup_pages.py::test_each_setup_pages_config_check_prints_what_the_page_shows",
    ("docs/telegram.md", "approval-broker config check approval-broker.toml"): "tests/system/test_channel_setup_pages.py::test_each_setup_pages_config_check_prints_what_the_page_shows",
    ("docs/discord.md", "approval-broker config check approval-broker.toml"): "tests/system/test_channel_setup_pages.py::test_each_setup_pages_config_check_prints_what_the_page_shows",
    ("docs/slack.md", "approval-broker channels test slack:approvals"): "tests/system/test_channel_setup_pages.py::test_each_setup_pages_channels_test_prints_what_the_page_shows",
    ("docs/teams.md", "approval-broker channels test teams:approvals"): "tests/system/test_channel_setup_pages.py::test_each_setup_pages_channels_test_prints_what_the_page_shows",
    ("docs/telegram.md", "approval-broker channels test telegram:ops"): "tests/system/test_channel_setup_pages.py::test_each_setup_pages_channels_test_prints_what_the_page_shows",
    ("docs/discord.md", "approval-broker channels test discord:ops"): "tests/system/test_channel_setup_pages.py::test_each_setup_pages_channels_test_prints_what_the_page_shows",
    ("docs/insights.md", "approval-broker stats --since 2026-12-01"): "tests/integration/test_stats.py::test_the_stats_command_prints_the_same_figures",
    ("docs/policy-rules.md", "approval-broker rules add --effect route --tool refund --args '{\"amount\": {\"gt\": 500}}' --route '{\"queue\": \"finance\", \"quorum\": 2, \"risk\": \"high\"}'"): "tests/integration/test_routing_rules.py::test_the_cli_adds_a_route_rule_as_the_docs_show",
}  # fmt: skip

SKIPPED = {
    ("docs/contributing.md", "uv run ruff check .            # lint"): "the checks .ci/run runs before the tests: this CI run is them",
    ("docs/contributing.md", "uv run pytest tests/unit                         # one level"): "runs parts of the test suite: this run is the whole of it",
    ("docs/adding-a-channel.md", "uv run pytest tests/channels/test_contract.py -k fakechat -n 0"): "runs parts of the test suite: this run is the whole of it",
    ("README.md", "uv sync                                # the broker and its command, approval-broker"): "installs the project: this test run stands on it",
    ("docs/index.md", "uv sync                                # the broker and its command, approval-broker"): "installs the project: this test run stands on it",
    ("README.md", "pip install \"approval-broker-client[pydantic-ai] @ file:///path/to/approval-broker/clients/python\""): "installs into the reader's own environment; tests/system/test_client_package.py checks the package",
    ("docs/index.md", "pip install \"approval-broker-client[pydantic-ai] @ file:///path/to/approval-broker/clients/python\""): "installs into the reader's own environment; tests/system/test_client_package.py checks the package",
    ("docs/mcp.md", "pip install \"approval-broker-client[pydantic-ai] @ file:///path/to/approval-broker/clients/python\""): "installs into the reader's own environment; tests/system/test_client_package.py checks the package",
    ("docs/benchmarks.md", "uv run --group bench python bench/run_all.py   # about 20–25 minutes; --quick for a smoke run"): "minutes of benchmarks on a machine of their own, not a test",
    ("docs/channels.md", "curl -s \"https://api.telegram.org/bot$TELEGRAM_BOT_TOKEN/setWebhook\" \\"): "needs Telegram's servers and a bot token",
    ("docs/telegram.md", "curl -s \"https://api.telegram.org/bot$TELEGRAM_BOT_TOKEN/setWebhook\" \\"): "needs Telegram's servers and a bot token",
    ("docs/telegram.md", "curl -s \"https://api.telegram.org/bot$TELEGRAM_BOT_TOKEN/getUpdates\""): "needs Telegram's servers and a bot token",
    ("docs/channels.md", "APPROVAL_BROKER_CONFIG=approval-broker.toml uv run approval-broker up --demo"): "needs Telegram's and Discord's servers to reach the API over HTTPS",
    ("docs/walkthrough.md", "export SLACK_BOT_TOKEN=xoxb-... SLACK_SIGNING_SECRET=..."): "needs Slack's servers and a Slack app (tests/channels/slack/test_walkthrough_slack_config.py: this config's approver decides by a signed click)",
    ("docs/deployment.md", "cp deploy/.env.example deploy/.env     # fill in the admin token and the secrets the config names"): "needs Docker (tests/system/test_deploy.py check the compose files and image)",
    ("docs/tracing.md", "export OTEL_EXPORTER_OTLP_ENDPOINT=http://otel-collector:4318   # OTLP over HTTP (protobuf)"): "needs an OTLP collector at otel-collector (tests/system/test_tracing_fleet.py runs the fleet against a local one)",
    ("docs/workers.md", "approval-broker worker --concurrency 100          # or [workers] concurrency = 100"): "runs until stopped; tests/system/test_workers_fleet.py starts workers with --concurrency",
}  # fmt: skip


def test_every_shell_example_is_run_or_skipped_for_a_reason() -> None:
    keys = [e.key for e in examples()]
    listed = {**RUN_HERE, **ELSEWHERE, **SKIPPED}
    unlisted = [f"{page}: {first}" for page, first in keys if (page, first) not in listed]
    assert unlisted == [], "examples no test runs and no skip entry explains"
    stale = [f"{page}: {first}" for page, first in listed if (page, first) not in keys]
    assert stale == [], "entries for examples the docs no longer have"
    assert len(keys) == len(set(keys)), "two examples on one page start alike: tell them apart"
    for where in ELSEWHERE.values():
        file, _, name = where.partition("::")
        if name:
            assert f"def {name}(" in (ROOT / file).read_text(), where
    assert all(reason for reason in SKIPPED.values())


# ---- the live `up` and running a block -----------------------------------------------------

CONFIG = """
[queues.default]
channels = ["inbox"]

[queues.managers]
channels = ["inbox"]
"""


@dataclass
class Live:
    url: str
    env: dict[str, str]
    cwd: Path

    def http(self) -> httpx.Client:
        headers = {"Authorization": f"Bearer {ADMIN}"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=10)

    def run(self, command: str, **ids: str) -> subprocess.CompletedProcess[str]:
        """One command of a block, with the reader's substitutions; fails the test on a
        non-zero exit unless the caller expects one (`check=False` via `run_unchecked`)."""
        done = self.run_unchecked(command, **ids)
        assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
        return done

    def run_unchecked(self, command: str, **ids: str) -> subprocess.CompletedProcess[str]:
        text = command.removeprefix("$ ").replace("uv run approval-broker", "approval-broker")
        text = text.replace("localhost:8000", self.url.removeprefix("http://"))
        for placeholder, value in ids.items():
            text = text.replace(placeholder, value)
        return subprocess.run(
            ["bash", "-c", text],
            env=self.env, cwd=self.cwd, capture_output=True, text=True, timeout=120,
        )  # fmt: skip


def commands(block: str) -> list[str]:
    """A block's commands: continued lines joined (a trailing `\\`, or an open quote), comment
    lines, `TOKEN=...` (the reader's own token) and console output left out."""
    out: list[str] = []
    current = ""
    console = any(line.startswith("$ ") for line in block.splitlines())
    for line in block.splitlines():
        if not current:
            stripped = line.strip()
            if not stripped or stripped.startswith("#") or stripped.startswith("TOKEN=..."):
                continue
            if console and not line.startswith("$ "):
                continue  # what the command printed
        current += line + "\n"
        if current.count("'") % 2 == 0 and not line.rstrip().endswith("\\"):
            out.append(current.strip())
            current = ""
    assert not current, f"an unfinished command: {current}"
    return out


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """The walkthrough's first step as written (`uv run approval-broker up --demo --fresh`),
    on a free port and a data dir of its own, with a config that has the `managers` queue the
    HTTP API page pages through."""
    [start] = commands(example("docs/walkthrough.md", "uv run approval-broker up --demo --fresh").text)  # fmt: skip
    assert start == "uv run approval-broker up --demo --fresh"
    home = tmp_path_factory.mktemp("docs-examples")
    [shadow] = [b for b in blocks(page("policy-rules.md"), "toml") if "small-refunds-trial" in b]
    (home / "approval-broker.toml").write_text(CONFIG + shadow)  # the rule `replay` replays
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPROVAL_BROKER_")}
    env.update(
        APPROVAL_BROKER_ADMIN_TOKEN=ADMIN,
        APPROVAL_BROKER_CONFIG=str(home / "approval-broker.toml"),
        APPROVAL_BROKER_DATA_DIR=str(home / "data"),  # where the shell commands find its Redis
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        PYTHONUNBUFFERED="1",
        TOKEN=ADMIN,
    )
    command = [Path(sys.executable).parent / "approval-broker", *start.split()[3:]]
    proc = subprocess.Popen(
        [str(c) for c in command] + ["--port", str(port)],
        env=env, cwd=home, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: healthy(url) or proc.poll() is not None, timeout=180)
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        yield Live(url, env, home)
    finally:
        if proc.poll() is None:
            stop_up(proc)


def pending_ids(live: Live, **params: str) -> list[dict]:
    with live.http() as http:
        return http.get("/v1/requests", params={"status": "pending", **params}).json()


def run_request(live: Live, run_id: str) -> dict | None:
    """The pending request a run waits on, once its worker has got that far."""
    found = [r for r in pending_ids(live) if r.get("run_id") == run_id]
    return found[0] if found else None


def start_refund(live: Live, prompt: str) -> dict:
    with live.http() as http:
        run_id = http.post("/v1/runs", json={"agent": "refunds", "prompt": prompt}).json()["run_id"]
    return wait_for(lambda: run_request(live, run_id), timeout=120, interval=0.1)


# ---- the examples --------------------------------------------------------------------------


def test_the_walkthrough_shell_step(live: Live) -> None:
    wait_for(lambda: len(pending_ids(live)) >= 3, timeout=120, interval=0.1)  # the demo's
    listing, decide = commands(
        example(
            "docs/walkthrough.md",
            "uv run approval-broker pending              # one line per request, its id first",
        ).text
    )
    shown = live.run(listing).stdout
    first = re.match(r"(\S+)  ", shown)
    assert first, shown
    decided = live.run(decide, REQ_ID=first.group(1))
    assert decided.stdout.strip() == f"{first.group(1)}: rejected"
    with live.http() as http:
        request = http.get(f"/v1/requests/{first.group(1)}").json()
    assert request["decision"]["reason"] == "Photos show wear, not damage"


def test_the_walkthrough_http_step(live: Live) -> None:
    block = example(
        "docs/walkthrough.md",
        "TOKEN=...   # the admin token from the banner, or an approver's token",
    )
    start, listing, decide = commands(block.text)
    run_id = json.loads(live.run(start).stdout)["run_id"]

    def waiting() -> str | None:
        found = [r for r in json.loads(live.run(listing).stdout) if r["run_id"] == run_id]
        return found[0]["id"] if found else None

    request_id = wait_for(waiting, timeout=120, interval=0.2)
    assert json.loads(live.run(decide, REQ_ID=request_id).stdout)["status"] == "approved"
    with live.http() as http:
        run = wait_for(
            lambda: (r := http.get(f"/v1/runs/{run_id}").json())["status"] == "finished" and r,
            timeout=120,
            interval=0.2,
        )
    assert run["output"]["refunded"] is True and run["output"]["order_id"] == "A106"


def test_the_rules_commands(live: Live) -> None:
    block = example(
        "docs/policy-rules.md",
        'approval-broker rules add --effect allow --tool refund --agent refunds --args \'{"amount": {"le": 100}}\'',
    )
    add, listing, revoke, replay = commands(block.text)
    made = live.run(add).stdout
    rule_id = made.split(":")[0].strip()
    assert made.strip() == f"{rule_id}: allow refund (active)"
    assert rule_id in live.run(listing).stdout
    live.run(revoke.split("#")[0], RULE_ID=rule_id)
    assert rule_id not in live.run(listing).stdout  # --active: a revoked rule is not
    assert "approval requests created since 2026-11-01" in live.run(replay).stdout


def test_remembering_a_rule_from_a_decision(live: Live) -> None:
    block = example(
        "docs/policy-rules.md",
        'curl -s -X POST localhost:8000/v1/requests/REQ_ID/decision -H "Authorization: Bearer $TOKEN" \\',
    )
    by_curl, by_cli = commands(block.text)
    first = start_refund(live, "Refund $70 on order A100 because the laces snapped.")
    second = start_refund(live, "Refund $65 on order A103 because a pole bent.")
    decided = json.loads(live.run(by_curl, REQ_ID=first["id"]).stdout)
    assert decided["status"] == "approved", decided
    kept, outcome = live.run(by_cli, REQ_ID=second["id"]).stdout.strip().splitlines()
    assert kept.startswith("rule rule_") and " kept: " in kept
    assert outcome == f"{second['id']}: approved"
    with live.http() as http:
        rules = http.get("/v1/rules").json()
    assert {first["id"], second["id"]} <= {r["from_request"] for r in rules}


def test_the_replay_console(live: Live) -> None:
    [replay] = commands(example("docs/policy-rules.md", "approval-broker rules replay --since 2026-11-01").text)  # fmt: skip
    out = live.run(replay).stdout
    created, shadow, *disagrees = out.splitlines()
    assert re.fullmatch(r"\d+ approval requests created since 2026-11-01 00:00:00Z", created), out
    assert re.fullmatch(
        r"small-refunds-trial \(shadow\)  allow refund: would decide \d+; agreements \d+, "
        r"disagreements \d+, undecided \d+, unknown \d+",
        shadow,
    ), out
    assert all(re.fullmatch(r"  disagrees: \S+ was \w+ by \S+", line) for line in disagrees), out


def test_the_next_page_link(live: Live) -> None:
    block = example(
        "docs/http-api.md",
        'curl -si "localhost:8000/v1/requests?status=pending&queue=managers&limit=50" -H "Authorization: Bearer $TOKEN" | grep -i \'^link\'',
    )
    [command] = commands(block.text)
    with live.http() as http:
        for n in range(51):
            made = http.post("/v1/requests", json={"tool_name": "wire", "args": {"n": n}, "queue": "managers"})  # fmt: skip
            assert made.status_code == 201, made.text
    out = live.run(command).stdout
    assert re.fullmatch(r'link: </v1/requests\?status=pending&queue=managers&limit=50&cursor=[\w=-]+>; rel="next"\s*', out, flags=re.I), out  # fmt: skip


def test_the_remote_agents_curl_calls(live: Live) -> None:
    block = example("docs/remote-agents.md", "TOKEN=...   # a token with the requester role")
    create, wait_one, wait_many = commands(block.text)
    made = json.loads(live.run(create).stdout)
    assert made["status"] == "pending" and made["tool_name"] == "issue_refund"
    again = json.loads(live.run(create).stdout)  # the same Idempotency-Key: the same request
    assert again["id"] == made["id"]
    with live.http() as http:
        http.post(f"/v1/requests/{made['id']}/decision", json={"outcome": "approved"})
        one = json.loads(live.run(wait_one, REQ_ID=made["id"]).stdout)
        assert one["status"] == "approved" and one["decision"]["decided_by"] == "admin"
        a, b = (
            http.post("/v1/requests", json={"tool_name": "wire", "args": {"k": k}}).json()["id"]
            for k in ("a", "b")
        )
        http.post(f"/v1/requests/{b}/decision", json={"outcome": "rejected", "reason": "no"})
    many = json.loads(live.run(wait_many, REQ_1=a, REQ_2=b).stdout)
    assert [(r["id"], r["status"]) for r in many] == [(a, "pending"), (b, "rejected")]


def test_the_audit_export_and_verify_console(live: Live) -> None:
    """The dates are the reader's: today's entries stand in for the example's day."""
    block = example(
        "docs/audit.md",
        "approval-broker audit export --since 2026-12-01 --until 2026-12-02 -o day.jsonl",
    )
    export, verify, verify_tampered = commands(block.text)
    today = dt.datetime.now(dt.UTC).date()
    days = {"2026-12-01": str(today), "2026-12-02": str(today + dt.timedelta(days=1))}
    live.run(export, **days)
    whole = live.run(verify).stdout.strip()
    assert re.fullmatch(r"audit trail whole \(main: \d+ entries\)", whole), whole
    lines = (live.cwd / "day.jsonl").read_text().splitlines()
    assert len(lines) >= 4
    entry = json.loads(lines[3])
    entry["actor"] = "mallory"
    lines[3] = json.dumps(entry)
    (live.cwd / "tampered.jsonl").write_text("\n".join(lines) + "\n")
    refused = live.run_unchecked(verify_tampered)
    assert refused.returncode == 1
    assert (refused.stdout + refused.stderr).strip() == (
        "audit trail NOT whole: line 4 (chain main, seq 4): entry changed: "
        "its hash does not match its fields"
    )
