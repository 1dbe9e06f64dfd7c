"""The remember-a-decision setup: two people, their config, and a round of requests to decide."""

from __future__ import annotations

from broker.domain.models import NewRequest
from broker.facade import Broker
from tests.support.auth import bearer, person

PAT, ALICE = bearer("tok-pat"), bearer("tok-alice")


RAW = {
    "queues": {"default": {"channels": ["inbox"]}},
    "agents": {"refunds": {"path": "refunds_demo:agent"}},
    "approvers": {
        "pat": person("tok-pat", ["policy"]),
        "alice": person("tok-alice", ["finance"]),
    },
}


def round_of(broker: Broker, n: int = 2, tool: str = "refund") -> tuple[str, list]:
    run_id = broker.create_run("refunds", "p").id
    calls = [NewRequest(tool_name=tool, args={"amount": 10 * (i + 1)}) for i in range(n)]
    return run_id, broker.create_round(run_id, 1, calls)
