"""Every Python example in README.md and docs/*.md compiles, and runs as written here or in a
named test elsewhere, or is listed with the reason it can't run: a new example that is none of
these fails `test_every_python_example_is_run_or_listed`.

"As written" allows what a reader supplies: the names a fragment takes from the page's prose
(`request`, `receipt`, `broker`), set before it runs, and the broker's address. The receipt
checks run in a fresh interpreter with Python's default warning filters, as a reader's script
does, so a warning they print (joserfc's about the `EdDSA` name) fails them.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.messages import ToolReturnPart
from redis import Redis

from api.app import create_app
from api.testing import ServerThread
from broker.audit import AuditTrail
from broker.domain.args_hash import args_hash
from broker.domain.config import parse_config
from broker.domain.models import NewRequest
from broker.domain.settings import Settings
from broker.facade import Broker
from tests.support.auth import person
from tests.support.docs_examples import ROOT
from tests.support.receipts import key_file


def examples() -> dict[tuple[str, str], str]:
    """(page, first line that is not a comment) -> the block, for every ```python block."""
    found: dict[tuple[str, str], str] = {}
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text()
        for m in re.finditer(r"^[ \t]*```python\n(.*?)^[ \t]*```", text, flags=re.S | re.M):
            body = textwrap.dedent(m.group(1))
            first = next(ln for ln in body.splitlines() if ln.strip() and not ln.startswith("#"))
            key = (str(path.relative_to(ROOT)), first)
            assert key not in found, f"two examples on one page start alike: {key}"
            found[key] = body
    return found


def example(page: str, first: str) -> str:
    return examples()[(page, first)]


# ---- where each example runs ----------------------------------------------------------------

RUN_HERE = {
    ("README.md", "import httpx"): "test_the_receipt_checks_run_and_warn_of_nothing",
    ("docs/index.md", "import httpx"): "test_the_receipt_checks_run_and_warn_of_nothing",
    ("docs/receipts.md", "import warnings"): "test_the_receipt_checks_run_and_warn_of_nothing",
    ("docs/audit.md", "from broker.audit import append_entry"): "test_the_audit_append_example_joins_the_chain",
    ("docs/questions.md", "from pydantic import BaseModel"): "test_the_questions_example_defines_its_tools_and_reads_an_answer",
}  # fmt: skip

ELSEWHERE = {
    ("README.md", "import os"): "tests/system/test_readme_quickstart.py::test_the_in_process_quickstart_runs_as_written",
    ("docs/index.md", "import os"): "tests/system/test_readme_quickstart.py::test_the_in_process_quickstart_runs_as_written",
    ("README.md", "from pydantic_ai import Agent, DeferredToolRequests"): "tests/system/test_own_project.py::test_readme_quickstart_2_runs_in_a_project_of_ones_own",
    ("docs/index.md", "from pydantic_ai import Agent, DeferredToolRequests"): "tests/system/test_own_project.py::test_readme_quickstart_2_runs_in_a_project_of_ones_own",
    ("docs/remote-agents.md", "import os"): "tests/integration/test_remote_readme.py::test_the_remote_agent_example_runs_as_shown",
    ("docs/testing.md", "from broker.testing import InMemoryBroker"): "tests/unit/test_readme.py::test_the_broker_testing_example_runs_as_shown",
    ("docs/adding-a-channel.md", "class FakeChatPlugin(ChannelPlugin):"): "tests/channels/test_adding_a_channel_page.py::test_each_python_block_on_the_page_is_the_worked_examples_code_as_written",
    ("docs/adding-a-channel.md", "class FakeChatConfig(ChannelSection):"): "tests/channels/test_adding_a_channel_page.py::test_each_python_block_on_the_page_is_the_worked_examples_code_as_written",
    ("docs/adding-a-channel.md", "def post(self, request: Request) -> PostState:"): "tests/channels/test_adding_a_channel_page.py::test_each_python_block_on_the_page_is_the_worked_examples_code_as_written",
    ("docs/adding-a-channel.md", '@router.post("/events", response_model=None)'): "tests/channels/test_adding_a_channel_page.py::test_each_python_block_on_the_page_is_the_worked_examples_code_as_written",
    ("docs/adding-a-channel.md", '@pytest.fixture(scope="module", autouse=True)'): "tests/channels/test_adding_a_channel_page.py::test_each_python_block_on_the_page_is_the_worked_examples_code_as_written",
    ("docs/adding-a-channel.md", "def reply(self, world: World, request_id: str, person: str, how: str) -> Reply:"): "tests/channels/test_adding_a_channel_page.py::test_each_python_block_on_the_page_is_the_worked_examples_code_as_written",
}  # fmt: skip
"""docs/index.md is README.md with its links made relative to docs/ (test_docs_site.py)."""

SKIPPED = {
    ("docs/fleet.md", "from broker.runs.agents import register_agent"): "needs the reader's `myapp.agents` and an agent worker running it (tests/system/test_workers_fleet.py runs agents registered by path on a fleet)",
    ("docs/internals.md", "class CopyUpdater(Protocol):"): "the outline of a protocol for channel authors (its real one is `channels.copies.CopyUpdater`), not a program",
}  # fmt: skip


def test_every_python_example_is_run_or_listed() -> None:
    keys = set(examples())
    listed = {**RUN_HERE, **ELSEWHERE, **SKIPPED}
    assert sorted(keys - set(listed)) == [], "examples no test runs and no skip entry explains"
    assert sorted(set(listed) - keys) == [], "entries for examples the docs no longer have"
    for where in ELSEWHERE.values():
        file, _, name = where.partition("::")
        assert f"def {name}(" in (ROOT / file).read_text(), where
    for name in RUN_HERE.values():
        assert name in globals(), name
    assert all(SKIPPED.values())


def test_every_python_example_compiles() -> None:
    for (page, first), body in examples().items():
        compile(body, f"{page}: {first}", "exec")


# ---- receipts --------------------------------------------------------------------------------

TOKENS = {"agent": "tok-agent", "bob": "tok-bob"}
ARGS = {"order_id": "A103", "amount": 120}  # what the README's example runs


@pytest.fixture
def decided(redis: Redis, tmp_path: Path) -> Iterator[tuple[str, dict]]:
    """A real API with receipts on, and an `issue_refund` request bob approved: (URL, request)."""
    cfg = parse_config(
        {
            "approvers": {
                "agent": person(TOKENS["agent"], ["requester"]),
                "bob": person(TOKENS["bob"], ["finance"]),
            },
            "receipts": {"key_file": str(key_file(tmp_path))},
        }
    )
    with ServerThread(create_app(Settings(), cfg, Broker(redis, cfg, prefix="t:"))) as server:
        with httpx.Client(base_url=server.url, timeout=10) as http:
            made = http.post(
                "/v1/requests",
                json={"tool_name": "issue_refund", "args": ARGS},
                headers={"Authorization": f"Bearer {TOKENS['agent']}"},
            ).json()
            request = http.post(
                f"/v1/requests/{made['id']}/decision",
                json={"outcome": "approved"},
                headers={"Authorization": f"Bearer {TOKENS['bob']}"},
            ).json()
        assert request["decision"]["receipt"], request
        yield server.url, request


@pytest.mark.parametrize(
    "page, first",
    [("README.md", "import httpx"), ("docs/index.md", "import httpx"), ("docs/receipts.md", "import warnings")],
)  # fmt: skip
def test_the_receipt_checks_run_and_warn_of_nothing(
    decided: tuple[str, dict], page: str, first: str
) -> None:
    url, request = decided
    given = (
        f"import json\nrequest = json.loads({json.dumps(request)!r})\n"
        f"receipt = request['decision']['receipt']\n"
        f"broker_url = {url!r}\n"
    )
    code = example(page, first).replace("http://127.0.0.1:8000", url)
    done = subprocess.run(
        [sys.executable, "-c", given + code + "\nprint(claims['sub'], claims['tool_name'])"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    assert done.stdout.split() == [request["id"], "issue_refund"]


# ---- the audit trail, questions -------------------------------------------------------------


def test_the_audit_append_example_joins_the_chain(broker: Broker) -> None:
    request = broker.create_request(NewRequest(tool_name="refund", args={"amount": 5}))
    given = {"broker": broker, "request_id": request.id, "digest": args_hash({"amount": 5})}
    exec(compile(example("docs/audit.md", "from broker.audit import append_entry"), "docs/audit.md", "exec"), given)  # noqa: S102 - our own docs  # fmt: skip
    entries = list(AuditTrail(broker.redis, broker.keys).entries())
    assert [(e.event, e.request_id) for e in entries][-1] == ("receipt_spent", request.id)
    assert entries[-1].seq == entries[-2].seq + 1 and entries[-1].prev == entries[-2].hash


def test_the_questions_example_defines_its_tools_and_reads_an_answer() -> None:
    answer = {"title": "Rotate the keys", "hours": 2}
    given: dict[str, object] = {
        "agent": Agent("test"),
        "part": ToolReturnPart(tool_name="file_ticket", content="", metadata=answer),
    }
    code = example("docs/questions.md", "from pydantic import BaseModel")
    exec(compile(code, "docs/questions.md", "exec"), given)  # noqa: S102 - our own docs
    ticket = given["ticket"]
    assert isinstance(ticket, BaseModel) and ticket.model_dump() == answer
    agent = given["agent"]
    assert isinstance(agent, Agent)
    tools = {name for toolset in agent.toolsets for name in getattr(toolset, "tools", {})}
    assert tools == {"choose_auth", "file_ticket"}
