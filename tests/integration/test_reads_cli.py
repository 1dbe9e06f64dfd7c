"""`approval-broker pending` lists every pending request, paging the index, not the first 1,000."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from approval_broker.cli import app
from broker.domain.models import NewRequest
from broker.facade import Broker


@pytest.fixture
def env(redis_url: str, tmp_config, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_config('[queues.default]\nescalate_to = "managers"\n[queues.managers]\n')
    monkeypatch.setenv("APPROVAL_BROKER_REDIS_URL", redis_url)
    monkeypatch.setenv("APPROVAL_BROKER_CONFIG", str(path))
    monkeypatch.setenv("APPROVAL_BROKER_KEY_PREFIX", "t:")


def test_pending_shows_every_request_of_a_long_queue_once(env: None, broker: Broker) -> None:
    made = broker.create_requests(
        [NewRequest(tool_name="refund", args={"i": i}) for i in range(1203)]
    )
    out = CliRunner().invoke(app, ["pending", "--json", "--queue", "default"])
    assert out.exit_code == 0, out.output
    ids = [json.loads(line)["id"] for line in out.stdout.splitlines()]
    assert len(ids) == len(set(ids)) == 1203 and set(ids) == {r.id for r in made}
    empty = CliRunner().invoke(app, ["pending", "--queue", "managers"])
    assert empty.exit_code == 0 and empty.stdout.strip() == "nothing pending"
