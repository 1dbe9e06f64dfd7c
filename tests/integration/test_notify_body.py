"""The webhook body built from the stored hash (broker.store.request_json, stored_requests) is byte
for byte `Request.model_dump_json()` of the request `parse_request` reads, for every shape the
broker writes; a hash outside those shapes takes the pydantic way, so a malformed one still
raises as before and an odd but valid one gives the same bytes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from redis import Redis

from broker.domain.config import parse_config
from broker.domain.events import parse_entry
from broker.domain.models import Decision, HistoryEntry, NewRequest, Request, utcnow
from broker.domain.rules.models import parse_body
from broker.facade import Broker, StoredRequest
from broker.store.request_hash import parse_request
from broker.store.request_json import ORDER, request_json, request_values
from channels.webhook.sender import delivery_body, webhook_body
from notifiers.commit import _note, _stamp
from notifiers.tasks import InflightEntry, Task
from tests.support.fakes.harness import SECRET

UNICODE = 'é"\\ \n\t\x01\x7f\u2028 😀 \u00a0/'


@pytest.fixture
def shapes_broker(redis: Redis) -> Broker:
    config = parse_config(
        {
            "queues": {
                "default": {"channels": ["inbox"], "timeout_s": 600, "escalate_to": "managers"},
                "managers": {"channels": ["inbox"], "timeout_s": 1800},
                "pair": {"channels": ["inbox"], "quorum": 2},
            },
            "webhooks": {"ops": {"url": "http://127.0.0.1:9/hook", "secret": SECRET}},
        }
    )
    return Broker(redis, config, prefix="body:")


def fields_of(broker: Broker, request_id: str) -> dict[str, str]:
    raw = broker.redis.hgetall(broker.keys.request(request_id))
    return {k.decode(): v.decode() for k, v in raw.items()}


def assert_same_bytes(fields: dict[str, str], *, fast: bool | None = True) -> None:
    """The stored-fields body equals the model's; `fast`: without the pydantic way (None:
    either way)."""
    expected = parse_request(fields).model_dump_json().encode()
    values = request_values(fields)
    assert fast is None or (values is not None) is fast, fields
    assert StoredRequest.load(fields).data_json() == expected
    if values is not None:
        assert request_json(values) == expected
        assert tuple(values) == ORDER


def every_shape(broker: Broker) -> list[str]:
    """Requests in each state the broker writes, by its own steps (Lua and Python)."""
    made: list[str] = []

    def new(**kw: Any) -> str:
        request = broker.create_request(NewRequest(**{"tool_name": "refund", **kw}))
        made.append(request.id)
        return request.id

    new(args={"order": 1, "amount": 10})
    new(
        args={"to": "/srv/é", "n": [1, {"y": None}], "f": 2.5e-7, "big": 2**63, "t": True},
        prompt=UNICODE,
        data={"k": [1, 2.5, UNICODE], "none": None},
        metadata={"customer": "c-17", "ü": [1e300, -0.0]},
        args_schema={"type": "object", "properties": {"to": {"type": "string"}}},
        allowed_roles=["finance", "ops"],
        callback="ops",
        tool_call_id="call_ü",
        created_by="agent-7",
    )
    new(args={"amount": 3.75}, data="just text", metadata={})
    new(args={}, data=[1, "two"])
    new(kind="question", args={"q": 1}, data={"questions": [{"id": "a", "text": "why?"}]})
    new(kind="external", args={"n": 2**70})
    run = broker.create_run("bot", "go").id
    calls = [NewRequest(tool_name="pay", args={"n": n}, tool_call_id=f"c{n}") for n in range(2)]
    made += [r.id for r in broker.create_round(run, 3, calls)]

    now = utcnow()
    who = "alice"
    broker.decide(new(args={"a": 1}), Decision(outcome="approved"), decided_by=who)
    broker.decide(
        new(args={"a": 2}), Decision(outcome="rejected", reason=UNICODE), decided_by="bob é"
    )
    broker.decide(
        new(args={"a": 3}),
        Decision(outcome="modified", args={"a": 30, "ü": [UNICODE]}, metadata={"m": 1}),
        decided_by=who,
    )
    asked = new(kind="question", args={"q": 2})
    broker.decide(asked, Decision(outcome="answered", answer={"a": [1, "x"]}), decided_by=who)
    escalated = new(args={"a": 4})
    broker.escalate(escalated, "managers", reason=UNICODE, decided_by=who)
    broker.decide(escalated, Decision(outcome="approved"), decided_by="carol")
    voted = new(args={"a": 5}, queue="pair")
    broker.decide(voted, Decision(outcome="approved"), decided_by=who)
    twice = new(args={"a": 6}, queue="pair")
    broker.decide(twice, Decision(outcome="approved"), decided_by=who)
    broker.decide(twice, Decision(outcome="approved"), decided_by="bob")
    acked = new(args={"a": 7})
    broker.acks.ack(acked, acked_by="dave", in_queue="default", channel="slack")
    noted = new(args={"a": 8})
    broker.add_history(noted, _note(_stamp(now), "delivered", "webhook:ops", UNICODE))
    broker.add_history(noted, HistoryEntry(at=now, event="delivery_failed", detail="x"))
    broker.add_history(noted, HistoryEntry(at=now.replace(microsecond=0), event="delivered"))
    broker.requests.rules.create(parse_body({"effect": "allow", "tool": "ruled"}), created_by="p")
    made.append(broker.create_request(NewRequest(tool_name="ruled", args={"x": 1})).id)
    timed_out = new(args={"a": 9}, queue="managers")
    broker.sweep(now=now.timestamp() + 10_000)  # and the default queue's escalate
    assert broker.get_request(timed_out).status == "timed_out"
    return made


def test_every_shape_the_broker_writes_gives_the_models_bytes(shapes_broker: Broker) -> None:
    broker = shapes_broker
    ids = every_shape(broker)
    statuses = set()
    for rid in ids:
        fields = fields_of(broker, rid)
        assert_same_bytes(fields)
        statuses.add(fields.get("status"))
        request = parse_request(fields)
        assert StoredRequest.load(fields).request == request  # the model, on first use
    assert {"pending", "approved", "rejected", "modified", "answered", "timed_out"} <= statuses


def test_the_webhook_body_is_the_same_bytes_as_from_the_model(shapes_broker: Broker) -> None:
    broker = shapes_broker
    ids = every_shape(broker)
    for n, rid in enumerate(ids):
        event = parse_entry(
            "s", "default", f"17357870{n:05d}-0", {"type": "approval.decided", "request_id": rid}
        )
        stored = StoredRequest.load(fields_of(broker, rid))
        expected = webhook_body(event, stored.request).encode()
        assert delivery_body(Task(InflightEntry(event, stored=stored), "webhook:x")) == expected
        assert delivery_body(Task(InflightEntry(event, stored.request), "webhook:x")) == expected
        assert json.loads(expected)["data"] == stored.request.public()


ODD_BUT_VALID: list[dict[str, str]] = [
    {"round": "+3"},
    {"round": "007"},
    {"quorum": " 2"},
    {"escalations": "1_0"},
    {"args_schema": "null"},
    {"decision": "null"},
    {"args": '{"a": NaN}'},
    {"args": '{"n": 123456789012345678901234567890}'},
    {"acked_until": "2026-12-01T10:00:00+01:00"},
    {"history": '[{"at": "2026-12-01T10:00:00.5+00:00", "event": "x"}]'},
    {"history": '[{"at": "2026-12-01T10:00:00Z", "event": "x", "extra": 1, "by": null}]'},
    {"approvals": '[{"by": "a", "at": "2026-12-01 10:00:00Z", "args_hash": "h"}]'},
    {"approvals": '[{"by": "a", "at": "2026-12-01T10:00:00.000001Z", "args_hash": "h"}]'},
    {"decision": '{"outcome": "approved", "decided_at": "2026-12-01T10:00:00.123Z"}'},
    {"decision": '{"outcome": "approved", "decided_at": 1764583200, "who": "x"}'},
    {"created_by": "", "acked_by": "", "acked_until": "", "run_id": "", "callback": ""},
    {"suggested_rules": "[]", "metadata": "{}", "allowed_roles": "[]"},
    {"deadlines": '{"x": 1}', "ack_queue": "default", "something_new": "1"},
    {"kind": "question"},
]
MALFORMED: list[dict[str, str]] = [
    {"args": "[1, 2]"},
    {"metadata": "null"},
    {"data": "nul"},
    {"round": "two"},
    {"round": ""},
    {"status": "bogus"},
    {"kind": "maybe"},
    {"created_at": "yesterday"},
    {"expires_at": "nan"},
    {"allowed_roles": '[{"x": 1}]'},
    {"suggested_rules": "[1]"},
    {"history": '[{"at": "2026-13-01T10:00:00Z", "event": "x"}]'},
    {"history": '[{"event": "x"}]'},
    {"history": '[{"at": "2026-12-01T10:00:00Z", "event": "x", "by": 7}]'},
    {"decision": '{"outcome": "maybe"}'},
    {"decision": '{"outcome": "modified"}'},
    {"decision": '{"outcome": "approved", "args": {"a": 1}}'},
    {"decision": '{"outcome": "approved", "target": "managers"}'},
    {"decision": '{"outcome": "approved", "args_hash": "%s"}' % ("h" * 129)},
    {"decision": '{"outcome": "rejected", "reason": "%s"}' % ("r" * 10_001)},
    {"approvals": '[{"by": "a", "at": "2026-12-01T10:00:00Z"}]'},
    {"approvals": '[{"by": "a", "at": "2026-12-01T10:00:00Z", "args_hash": "h", "channel": null}]'},
    {"acked_until": "soon"},
]


def test_odd_but_valid_hashes_give_the_models_bytes(shapes_broker: Broker) -> None:
    broker = shapes_broker
    base = fields_of(broker, broker.create_request(NewRequest(tool_name="pay", args={"a": 1})).id)
    for change in ODD_BUT_VALID:
        fields = {**base, **change}
        parse_request(fields)  # valid: the model reads it
        assert_same_bytes(fields, fast=None)


@pytest.mark.parametrize("change", MALFORMED)
def test_a_malformed_hash_raises_as_parse_request_does(
    shapes_broker: Broker, change: dict[str, str]
) -> None:
    broker = shapes_broker
    base = fields_of(broker, broker.create_request(NewRequest(tool_name="pay", args={"a": 1})).id)
    fields = {**base, **change}
    assert request_values(fields) is None
    with pytest.raises(Exception) as expected:
        parse_request(fields)
    with pytest.raises(expected.type):
        StoredRequest.load(fields)


def test_a_hash_missing_a_required_field_is_left_to_the_model(shapes_broker: Broker) -> None:
    broker = shapes_broker
    base = fields_of(broker, broker.create_request(NewRequest(tool_name="pay")).id)
    for name in ("id", "tool_name", "args_hash", "created_at", "expires_at"):
        fields = {k: v for k, v in base.items() if k != name}
        assert request_values(fields) is None
        with pytest.raises((KeyError, ValueError)):
            StoredRequest.load(fields)


def test_the_keys_are_the_models_in_its_order() -> None:
    assert ORDER == (*Request.model_fields, "approvals_by_args")


BIG = {"n": 2**70, "low": -(2**63) - 1, "edge": 2**64 - 1, "text": "order 12345678901234567890"}


def test_integers_past_64_bits_read_back_exact_everywhere(shapes_broker: Broker) -> None:
    # orjson reads them as floats: a reader, the API and the webhook body must show the integer
    made = shapes_broker.create_request(NewRequest(tool_name="t", args=BIG, metadata={"m": 10**30}))
    assert made.args == BIG and type(made.args["n"]) is int
    stored = shapes_broker.get_request(made.id)
    assert stored.args == BIG and type(stored.args["low"]) is int
    assert stored.metadata == {"m": 10**30}
    fields = fields_of(shapes_broker, made.id)
    values = request_values(fields)
    body = request_json(values) if values is not None else None
    assert body == parse_request(fields).model_dump_json().encode()
    assert b'"n":1180591620717411303424' in body and b"e+" not in body
