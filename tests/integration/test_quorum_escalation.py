"""An escalated request takes the quorum of the queue it reaches when that is higher (by hand
or by the sweeper), and never loses the one it had."""

from __future__ import annotations

import pytest
from redis import Redis

from broker.domain.config import Config, parse_config
from broker.domain.models import Decision, NewRequest, Outcome
from broker.facade import Broker


@pytest.fixture
def broker(redis: Redis) -> Broker:
    cfg: Config = parse_config(
        {
            "queues": {
                "default": {"channels": ["inbox"], "escalate_to": "finance", "timeout_s": 60},
                "finance": {"channels": ["inbox"], "quorum": 2, "escalate_to": "easy"},
                "easy": {"channels": ["inbox"]},
            }
        }
    )
    return Broker(redis, cfg, prefix="t:")


def approve(broker: Broker, rid: str, by: str) -> None:
    broker.decide(rid, Decision(outcome=Outcome.approved), decided_by=by)


def test_escalating_by_hand_raises_the_quorum_and_never_lowers_it(broker: Broker) -> None:
    req = broker.create_request(NewRequest(tool_name="wire"))
    assert req.quorum == 1
    moved = broker.escalate(req.id, "finance", decided_by="root")
    assert moved.quorum == 2
    approve(broker, req.id, "alice")
    assert broker.get_request(req.id).is_pending  # one vote of two
    assert broker.escalate(req.id, "easy", decided_by="root").quorum == 2  # not lowered
    approve(broker, req.id, "bob")
    assert broker.get_request(req.id).status.value == "approved"


def test_the_sweeper_raises_the_quorum_too(broker: Broker) -> None:
    req = broker.create_request(NewRequest(tool_name="wire"))
    [result] = broker.sweep(now=req.expires_at.timestamp() + 1)
    assert (result.action, result.to_queue) == ("escalated", "finance")
    assert broker.get_request(req.id).quorum == 2
    approve(broker, req.id, "alice")
    assert broker.get_request(req.id).is_pending
