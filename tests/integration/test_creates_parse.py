"""Reading a request back (`parse_request`, per delivery and per decision) validates the plain
JSON fields by their top level only (issue 18): what it gives equals full validation, and a
malformed hash still raises, each kind of damage as before."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from broker.domain.models import NewRequest, Request
from broker.facade import Broker
from broker.store.request_hash import parse_flat, parse_request


def stored(broker: Broker, request_id: str) -> dict[bytes, bytes]:
    return broker.redis.hgetall(broker.keys.request(request_id))


def full(raw: dict[bytes, bytes]) -> Request:
    """The request as full validation makes it (everything through the model)."""
    made = parse_request(raw)
    return Request.model_validate(made.model_dump())


def test_what_is_read_equals_full_validation(broker: Broker) -> None:
    new = NewRequest(
        tool_name="pay",
        args={"to": "/srv/x", "n": [1, {"y": None}], "big": 2**70},
        data={"k": [1, 2.5, "é"]},
        metadata={"customer": "c-17"},
        args_schema={"type": "object"},
        allowed_roles=["finance"],
    )
    standalone = broker.create_request(new)
    run = broker.create_run("bot", "go").id
    [in_round] = broker.create_round(run, 1, [new])
    for made in (standalone, in_round):
        raw = stored(broker, made.id)
        got = parse_request(raw)
        assert got == made == full(raw)
        text = {k.decode(): v.decode() for k, v in raw.items()}
        always = {"run_id", "callback", "tool_call_id", "created_at", "expires_at"}
        assert got.model_fields_set == (set(text) & set(Request.model_fields)) | always | {
            "suggested_rules"
        }  # what was given, as when every field went through validation
        assert got.args["big"] == 2**70 and got.suggested_rules
        assert parse_request(text) == got  # text in, as a Lua step's reply
        assert parse_flat([x for kv in text.items() for x in kv]) == got


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("args", b"[1, 2]", AttributeError),  # deriving the suggested rules fails first
        ("metadata", b"null", ValidationError),
        ("data", b"nul", ValueError),
        ("args", b"null", ValidationError),
        ("args", b"{not json", ValueError),
        ("metadata", b'"text"', ValidationError),
        ("args_schema", b"[]", ValidationError),
        ("suggested_rules", b"[1]", ValidationError),
        ("suggested_rules", b'{"a": 1}', ValidationError),
        ("allowed_roles", b'[{"x": 1}]', ValidationError),
        ("history", b'{"a": 1}', ValidationError),
        ("decision", b'{"outcome": "maybe"}', ValidationError),
        ("status", b"bogus", ValidationError),
        ("created_at", b"yesterday", ValueError),
        ("quorum", b"two", ValidationError),
    ],
)
def test_a_malformed_hash_raises(broker: Broker, field: str, value: bytes, error: type) -> None:
    made = broker.create_request(NewRequest(tool_name="pay", args={"to": "x"}))
    raw = {**stored(broker, made.id), field.encode(): value}
    with pytest.raises(error):
        parse_request(raw)


def test_odd_but_valid_values_read_as_before(broker: Broker) -> None:
    made = broker.create_request(NewRequest(tool_name="pay", args={"to": "x"}))
    raw = stored(broker, made.id)
    assert parse_request({**raw, b"args_schema": b"null"}).args_schema is None
    nan = parse_request({**raw, b"args": b'{"a": NaN}'}).args["a"]
    assert nan != nan


def test_a_hash_missing_its_times_or_id_raises(broker: Broker) -> None:
    made = broker.create_request(NewRequest(tool_name="pay"))
    raw = stored(broker, made.id)
    for name, error in ((b"created_at", KeyError), (b"id", ValidationError)):
        with pytest.raises(error):
            parse_request({k: v for k, v in raw.items() if k != name})
