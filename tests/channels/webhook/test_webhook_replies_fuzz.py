"""`POST /v1/webhooks/{name}/replies` under generated bodies, each signed validly with the
endpoint's secret (so every one reaches the parsers and the judge): no 5xx, a refusal is a 4xx
`{"error", "detail"}`, and a refused reply changes nothing in Redis (the request still pending,
no vote, no history entry, no stream entry, the webhook-id unspent). Bounded: `MAX_EXAMPLES`."""

from __future__ import annotations

import base64
import itertools
from typing import Any

from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.domain.models import NewRequest
from broker.facade import Broker
from tests.support.auth import person
from tests.support.decisions import snapshot
from tests.support.hostile_json import (
    HOSTILE_BODIES,
    RAW_TEXT,
    TEXT,
    VALUES,
    dumps,
    hostile_variants,
    near,
)
from tests.support.webhooks import post, signed

MAX_EXAMPLES = 150
SECRET = "whsec_" + base64.b64encode(b"webhook-fuzz-secret-0123456789ab").decode()
API_CONFIG = {
    "queues": {
        "default": {"channels": ["inbox", "webhook:ops"], "escalate_to": "managers"},
        "managers": {"channels": ["inbox", "webhook:ops"]},
        "pair": {"channels": ["inbox", "webhook:ops"], "quorum": 2},
        "elsewhere": {"channels": ["inbox"]},
    },
    "webhooks": {"ops": {"url": "http://127.0.0.1:9/ops", "secret": SECRET}},
    "approvers": {"alice": {**person("tok-alice-webhook-fuzz", []), "email": "a@example.test"}},
}
QUEUES = ["default", "pair", "elsewhere"]
_ids = itertools.count()


def replies(request_id: str) -> st.SearchStrategy[str]:
    """Reply bodies for `request_id`, as text: near-valid objects, any JSON, broken text."""
    optional = {
        "decided_by": "dana",
        "reason": "fine",
        "args": {"amount": 2},
        "answer": "yes",
        "target": "managers",
        "args_hash": "0" * 64,
        "remember": 0,
        "metadata": {"k": "v"},
    }
    outcomes = st.sampled_from(["approved", "modified", "rejected", "answered", "escalated",
                                "timed_out", "APPROVED", ""])  # fmt: skip
    shaped = st.tuples(
        st.one_of(st.just(request_id), st.just(request_id), TEXT),
        st.one_of(outcomes, outcomes, VALUES),
        near(optional, extra_keys=False),
    ).map(lambda t: {"request_id": t[0], "outcome": t[1], **t[2]})
    by_outcome = st.one_of(
        st.fixed_dictionaries({"outcome": st.just("approved")}, optional={"reason": TEXT}),
        st.fixed_dictionaries({"outcome": st.just("rejected"), "reason": TEXT}),
        st.fixed_dictionaries({"outcome": st.just("modified"), "args": st.dictionaries(TEXT, VALUES, max_size=3)}),
        st.fixed_dictionaries({"outcome": st.just("answered"), "answer": VALUES}),
        st.fixed_dictionaries({"outcome": st.just("escalated")}, optional={"target": st.one_of(st.just("managers"), TEXT)}),
    )  # fmt: skip
    decisions = st.tuples(by_outcome, st.one_of(st.none(), TEXT)).map(
        lambda t: {"request_id": request_id, **t[0], **({"decided_by": t[1]} if t[1] else {})}
    )
    return st.one_of(decisions.map(dumps), shaped.map(dumps), VALUES.map(dumps), RAW_TEXT)


class Endpoint:
    """Signed replies to endpoint `ops`, each checked: no 5xx; a refusal changes nothing."""

    def __init__(self, client: TestClient, broker: Broker) -> None:
        self.client = client
        self.broker = broker
        self.waiting: dict[str, str] = {}  # queue -> a pending request (a new one once decided)
        self.seen: dict[int, int] = {}

    def request_in(self, queue: str) -> str:
        if queue not in self.waiting:
            new = NewRequest(tool_name="t", args={"amount": 1}, queue=queue)
            self.waiting[queue] = self.broker.create_request(new).id
        return self.waiting[queue]

    def send(self, queue: str, body: str) -> None:
        request_id = self.request_in(queue)
        raw, headers = signed(body.encode("utf-8", "surrogatepass"), SECRET,
                              msg_id=f"msg_fuzz_{next(_ids)}")  # fmt: skip
        before = snapshot(self.broker.redis)
        resp = post(self.client, "ops", raw, headers)
        self.seen[resp.status_code] = self.seen.get(resp.status_code, 0) + 1
        assert resp.status_code < 500, (body[:300], resp.text[:300])
        if resp.status_code < 400:
            self.waiting.pop(queue)  # decided, voted or escalated: the next gets a fresh one
            return
        error = resp.json()
        assert error["error"] and error["detail"], error
        assert snapshot(self.broker.redis) == before, (body[:300], resp.status_code)
        stored = self.broker.get_request(request_id)
        assert stored.is_pending and stored.approvals == [] and stored.history == []


def test_no_signed_reply_gets_a_5xx_and_a_refused_one_changes_nothing(
    client: TestClient, api_broker: Broker
) -> None:
    endpoint = Endpoint(client, api_broker)
    for queue in QUEUES:  # every known hostile body, then generated ones
        valid = {"request_id": endpoint.request_in(queue), "outcome": "modified", "args": {}}
        for body in [*HOSTILE_BODIES, *hostile_variants(valid)]:
            endpoint.send(queue, body)

    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(queue=st.sampled_from(QUEUES), data=st.data())
    def run(queue: str, data: Any) -> None:
        endpoint.send(queue, data.draw(replies(endpoint.request_in(queue))))

    run()
    print("statuses seen:", dict(sorted(endpoint.seen.items())))
    assert endpoint.seen.get(422) and endpoint.seen.get(200)  # parsers and judge were reached
