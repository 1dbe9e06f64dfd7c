"""The README's "Agents that don't run on the fleet" example runs as written (on pydantic-ai's
TestModel instead of a real model), live and stopped-then-resumed, against a real API server."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator

import pytest
from approval_broker_client import RemoteBroker

from api.app import create_app
from api.testing import ServerThread
from broker.domain.config import Config
from broker.domain.settings import Settings
from broker.facade import Broker
from tests.support.auth import person
from tests.support.docs_examples import page

README = page("remote-agents.md")


API_CONFIG = {
    "approvers": {
        "agent": person("tok-agent", ["requester"]),
        "alice": person("tok-alice", ["finance"]),
    }
}


@pytest.fixture
def server(cfg: Config, api_broker: Broker) -> Iterator[ServerThread]:
    with ServerThread(create_app(Settings(), cfg, api_broker)) as s:
        yield s


def example() -> str:
    [code] = [
        b for b in re.findall(r"```python\n(.*?)```", README, flags=re.S) if "BrokerApprovals" in b
    ]
    return code.replace('"openai:gpt-4o-mini"', '"test"')


@pytest.mark.parametrize("live_wait_s", ["120", "0"])
def test_the_remote_agent_example_runs_as_shown(
    server: ServerThread, api_broker: Broker, monkeypatch: pytest.MonkeyPatch, live_wait_s: str
) -> None:
    monkeypatch.setenv("BROKER_URL", server.url)
    monkeypatch.setenv("BROKER_TOKEN", "tok-agent")
    code = example().replace("live_wait_s=120", f"live_wait_s={live_wait_s}")
    stop = threading.Event()

    def alice() -> None:  # approves what she sees, until the example is done
        with RemoteBroker(server.url, "tok-alice") as client:
            while not stop.is_set():
                for request in client.list_requests(status="pending"):
                    client.approve(request.id)
                stop.wait(0.02)

    person = threading.Thread(target=alice, daemon=True)
    person.start()
    namespace: dict[str, object] = {}
    try:
        exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102 - our own README
    finally:
        stop.set()
        person.join(10)
    [request] = api_broker.list_requests()
    assert request.tool_name == "issue_refund" and request.status == "approved"
    result = namespace["result"]
    assert "refunded $" in str(result.all_messages())  # the approved tool ran
    assert isinstance(result.output, str)
    assert ("stopped" in namespace) == (live_wait_s == "0")  # which way it went
