"""Schemas from requesters can't freeze the API: regexes on RE2, keywords listed, caps, a budget.

A `pattern` such as `^(a+)+$` against `aaaa…a!` takes seconds on a backtracking engine,
doubling per character: against 100 `a`s it would never end. The first tests start a real
`approval-broker api` process, send the hostile schema (as a requester-only token) or the
hostile value (as an approver) and poll `/healthz` from another thread meanwhile: the hostile
request must be answered and every `/healthz` too, each within a client timeout no linear
engine comes near and no backtracking one gets through (the times are printed, never asserted).
The rest check `broker.domain.schema_safety` directly: what is refused at create, with which
message, and that costly schemas are stopped by the work budget alone (with no deadline, so a
loaded machine changes nothing) or by the deadline.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from redis import Redis

from broker.domain import schema_safety
from broker.domain.args_schema import check_args
from broker.domain.args_schema import check_schema as check_args_schema
from broker.domain.errors import InvalidInput
from broker.domain.principals import hash_token
from broker.domain.questions import InvalidAnswer, validate_answer, validate_question_metadata
from broker.redis.embedded import EmbeddedRedis, free_port
from tests.support.proc import stop_process
from tests.support.waiting import wait_for

SERVICE = "tok-service-requester-only"
ALICE = "tok-alice-approver"
EVIL = "^(a+)+$"
EVIL_TEXT = "a" * 100 + "!"  # a backtracking engine needs ~2**100 steps to give up: never
ANSWER_TIMEOUT_S = 60
"""The hostile request's client timeout: RE2 answers in milliseconds, backtracking never."""
HEALTHZ_TIMEOUT_S = 30
"""Each /healthz's client timeout: only a loop held by the check (for ever) misses it."""


@pytest.fixture(scope="module")
def api(redis_server: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real `approval-broker api` process: `svc` may only ask, `alice` decides in `inbox`
    (on database 0 of the session's Redis, which the per-test databases never use)."""
    tmp_path = tmp_path_factory.mktemp("schema-api")
    redis_url = redis_server.url_for(0)
    Redis.from_url(redis_url).flushdb()
    config = tmp_path / "broker.toml"
    config.write_text(
        f"""
[queues.default]
channels = ["inbox"]
timeout_s = 600

[approvers.svc]
token_sha256 = "{hash_token(SERVICE)}"
roles = ["requester"]

[approvers.alice]
token_sha256 = "{hash_token(ALICE)}"
roles = ["finance"]
"""
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPROVAL_BROKER_")}
    env |= {
        "APPROVAL_BROKER_CONFIG": str(config),
        "APPROVAL_BROKER_REDIS_URL": redis_url,
        "PYTHONUNBUFFERED": "1",
    }
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "approval_broker", "api", "--port", str(port)],
        env=env,
        stdout=(tmp_path / "api.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        assert proc.poll() is None, (tmp_path / "api.log").read_text()
        try:
            return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        try:
            wait_for(healthy, timeout=180, interval=0.2)
        except AssertionError:
            raise AssertionError((tmp_path / "api.log").read_text()) from None
        yield url
    finally:
        stop_process(proc)


def while_healthz(url: str, send: Any) -> tuple[httpx.Response, list[int | str]]:
    """(the response of `send()`, what each /healthz answered meanwhile: a status or the
    error), with /healthz polled from another thread for as long as `send` runs (and once
    after). The times are printed for the reader."""
    answers: list[int | str] = []
    slowest = [0.0]
    done = threading.Event()

    def poll() -> None:
        with httpx.Client(timeout=HEALTHZ_TIMEOUT_S) as client:
            while True:
                last = done.is_set()
                started = time.monotonic()
                try:
                    answers.append(client.get(f"{url}/healthz").status_code)
                except httpx.HTTPError as exc:
                    answers.append(repr(exc))
                slowest[0] = max(slowest[0], time.monotonic() - started)
                if last:
                    return

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    started = time.monotonic()
    try:
        response = send()
    finally:
        took = time.monotonic() - started
        done.set()
        poller.join(2 * HEALTHZ_TIMEOUT_S)
    print(f"answered in {took:.3f} s; {len(answers)} /healthz meanwhile, the slowest {slowest[0]:.3f} s")  # fmt: skip
    return response, answers


def post(url: str, path: str, token: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        f"{url}{path}",
        json=body,
        headers={"Authorization": f"Bearer {token}"},
        timeout=ANSWER_TIMEOUT_S,
    )


def create(url: str, body: dict[str, Any]) -> httpx.Response:
    return post(url, "/v1/requests", SERVICE, body)


def test_a_hostile_answer_schema_at_create_leaves_healthz_answering(api: str) -> None:
    body = {
        "tool_name": "ask",
        "kind": "question",
        "metadata": {
            "answer_schema": {
                "type": "object",
                "properties": {"a": {"type": "string", "pattern": EVIL, "default": EVIL_TEXT}},
            }
        },
    }
    response, healthz = while_healthz(api, lambda: create(api, body))
    assert response.status_code == 422, response.text
    assert response.json()["error"] == "invalid_question"
    assert "default" in response.json()["detail"]
    assert healthz and set(healthz) == {200}, healthz


def test_hostile_modified_args_against_an_args_schema_leave_healthz_answering(api: str) -> None:
    created = create(
        api,
        {
            "tool_name": "wire",
            "args": {"to": "aaa"},
            "args_schema": {"type": "object", "properties": {"to": {"pattern": EVIL}}},
        },
    )
    assert created.status_code == 201, created.text
    decision = {"outcome": "modified", "args": {"to": EVIL_TEXT}}
    path = f"/v1/requests/{created.json()['id']}/decision"
    response, healthz = while_healthz(api, lambda: post(api, path, ALICE, decision))
    assert response.status_code == 422 and response.json()["error"] == "invalid_args", response.text
    assert healthz and set(healthz) == {200}, healthz


def test_a_hostile_answer_leaves_healthz_answering(api: str) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": EVIL}}}
    created = create(
        api, {"tool_name": "ask", "kind": "question", "metadata": {"answer_schema": schema}}
    )
    assert created.status_code == 201, created.text
    decision = {"outcome": "answered", "answer": {"a": EVIL_TEXT}}
    path = f"/v1/requests/{created.json()['id']}/decision"
    response, healthz = while_healthz(api, lambda: post(api, path, ALICE, decision))
    assert response.status_code == 422, response.text
    assert response.json()["error"] == "invalid_answer"
    assert healthz and set(healthz) == {200}, healthz
    fine = post(api, path, ALICE, {"outcome": "answered", "answer": {"a": "aaa"}})
    assert fine.status_code == 200 and fine.json()["status"] == "answered", fine.text


# ---- what is refused at create, and how it reads ---------------------------------------------


def args_refusal(schema: Any) -> str:
    with pytest.raises(InvalidInput) as err:
        check_args_schema(schema)
    assert err.value.code == "invalid_schema"
    return err.value.detail


def question_refusal(schema: Any) -> str:
    with pytest.raises(InvalidInput) as err:
        validate_question_metadata({"answer_schema": schema}, kind="question")
    assert err.value.code == "invalid_question"
    return err.value.detail


def obj(**props: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props}


@pytest.mark.parametrize(
    ("schema", "detail"),
    [
        (
            obj(to={"type": "string", "pattern": "^(a)\\1$"}),
            "args_schema.properties.to.pattern: regex '^(a)\\\\1$' is not supported",
        ),
        (
            obj(to={"pattern": "(?=a)a"}),
            "args_schema.properties.to.pattern: regex '(?=a)a' is not supported",
        ),
        (
            {"type": "object", "patternProperties": {"(a)\\1": {}}},
            "args_schema.patternProperties: regex '(a)\\\\1' is not supported",
        ),
        (
            {"type": "object", "$id": "https://example.com/s"},
            "args_schema: unsupported keyword '$id'",
        ),
        (
            {"type": "object", "unevaluatedProperties": False},
            "args_schema: unsupported keyword 'unevaluatedProperties'",
        ),
        (obj(to={"x-widget": "big"}), "args_schema.properties.to: unsupported keyword 'x-widget'"),
        (
            obj(to={"$ref": "https://example.com/schema.json"}),
            "args_schema.properties.to.$ref: $ref 'https://example.com/schema.json' points outside",
        ),
        (obj(to={"$ref": "#/$defs/Nope"}), "args_schema.properties.to.$ref: $ref '#/$defs/Nope'"),
        (
            {"$schema": "http://json-schema.org/draft-04/schema#", "type": "object"},
            "args_schema.$schema: only JSON Schema 2020-12 or draft 7",
        ),
        (obj(to={"pattern": "a" * 1001}), "args_schema.properties.to.pattern: a regex of at most"),
    ],
)
def test_unsupported_args_schemas_are_refused_naming_keyword_and_path(
    schema: dict[str, Any], detail: str
) -> None:
    assert args_refusal(schema).startswith(detail)


def test_a_schema_over_the_size_or_depth_cap_is_refused() -> None:
    big = obj(to={"enum": ["x" * 100] * 700})
    assert "bytes of JSON; at most 65536" in args_refusal(big)
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(20):
        deep = {"type": "object", "properties": {"a": deep}}
    assert "nested more than 32 deep" in args_refusal(deep)
    assert "nested more than 32 deep" in question_refusal(
        obj(a={"type": "string", "default": deep})
    )


def test_answer_schema_regexes_run_on_re2_and_are_refused_when_re2_cant() -> None:
    assert "pattern: regex '(a)\\\\1' is not supported" in question_refusal(
        obj(a={"type": "string", "pattern": "(a)\\1"})
    )
    assert "additionalProperties: must be true or false" in question_refusal(
        {**obj(a={"type": "string"}), "additionalProperties": {"type": "string"}}
    )
    metadata = {"answer_schema": obj(a={"type": "string", "pattern": EVIL})}
    validate_question_metadata(metadata, kind="question")
    # a backtracking engine would never answer this (2**5000 steps; Python's `re` can't be
    # interrupted meanwhile): the API tests above prove it answers, in another process
    with pytest.raises(InvalidAnswer) as err:
        validate_answer(metadata, {"a": "a" * 5000 + "!"})
    assert err.value.field == "a" and "does not match" in err.value.detail
    assert validate_answer(metadata, {"a": "aaaa"}) == {"a": "aaaa"}


def test_a_pydantic_tool_schema_with_refs_and_a_discriminator_is_kept_and_applied() -> None:
    schema = {
        "$defs": {
            "A": {
                "properties": {"kind": {"const": "a"}, "x": {"type": "integer"}},
                "type": "object",
            },
            "B": {
                "properties": {"kind": {"const": "b"}, "y": {"pattern": "^\\w+$"}},
                "type": "object",
            },
        },
        "additionalProperties": False,
        "properties": {
            "item": {
                "discriminator": {"mapping": {"a": "#/$defs/A"}, "propertyName": "kind"},
                "oneOf": [{"$ref": "#/$defs/A"}, {"$ref": "#/$defs/B"}],
            },
            "tags": {"items": {"type": "string"}, "type": "array", "uniqueItems": True},
        },
        "required": ["item"],
        "type": "object",
    }
    check_args_schema(schema)
    check_args(schema, {"item": {"kind": "b", "y": "word"}, "tags": ["a", "b"]})
    for bad, field in [
        ({"item": {"kind": "b", "y": "two words"}}, "args.item"),
        ({"item": {"kind": "a", "x": 1}, "tags": ["a", "a"]}, "args.tags"),
        ({"item": {"kind": "a", "x": 1}, "extra": 1}, "args.extra"),
    ]:
        with pytest.raises(InvalidInput) as err:
            check_args(schema, bad)
        assert err.value.code == "invalid_args" and f": {field}" in err.value.detail, (
            err.value.detail
        )


# ---- the work budget -------------------------------------------------------------------------


def costly(schema: dict[str, Any], value: Any) -> str:
    """Why applying `schema` to `value` is refused as too costly (it must be), with no
    deadline: only the work budget (or a loop) can stop it, whatever the machine's load."""
    schema_safety.check_schema(schema, "args_schema", "invalid_schema")
    with pytest.raises(schema_safety.TooCostly) as err:
        schema_safety.errors(schema, value, "args", "invalid_args", deadline_s=math.inf)
    return err.value.detail


def test_references_that_double_at_every_level_stop_within_the_budget() -> None:
    defs: dict[str, Any] = {"a0": {"type": "integer"}}
    for i in range(1, 40):
        defs[f"a{i}"] = {"allOf": [{"$ref": f"#/$defs/a{i - 1}"}, {"$ref": f"#/$defs/a{i - 1}"}]}
    assert costly({"$defs": defs, "$ref": "#/$defs/a39"}, 1).endswith("(too much work)")


def test_a_reference_loop_stops_instead_of_recursing() -> None:
    loop = {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
    assert costly(loop, 1).endswith("(references that loop)")


def test_a_large_enum_over_many_items_stops_within_the_budget() -> None:
    # charged by size: 20,000 items against 6,000 values each would be 120 million
    # comparisons; the budget stops it after a few items
    schema = {"type": "array", "items": {"enum": list(range(6000))}}
    assert costly(schema, [-1] * 20_000).endswith("(too much work)")


def test_a_validation_past_its_deadline_stops_at_its_next_keyword() -> None:
    schema = {"type": "array", "items": {"type": "integer"}}
    with pytest.raises(schema_safety.TooCostly) as err:
        schema_safety.errors(schema, [1, 2], "args", "invalid_args", deadline_s=-1)
    assert err.value.detail.endswith("(longer than -1 s)")
    assert schema_safety.errors(schema, [1, 2], "args", "invalid_args") == []


def test_unique_items_are_compared_by_hash_with_json_equality() -> None:
    schema = {"type": "array", "uniqueItems": True}
    assert schema_safety.errors(schema, [{"a": i} for i in range(5000)], "args", "c") == []
    assert schema_safety.errors(schema, [1, True, "1", [1], {"a": 1}], "args", "c") == []
    assert schema_safety.errors(schema, [1, 1.0], "args", "c")
    assert schema_safety.errors(schema, [{"a": [1, {"b": 2}]}, {"a": [1.0, {"b": 2}]}], "a", "c")


def test_an_instance_over_its_caps_is_refused() -> None:
    schema = {"type": "object"}
    with pytest.raises(InvalidInput, match="at most 262144"):
        schema_safety.errors(schema, {"a": "x" * 300_000}, "modified args", "invalid_args")
    deep: Any = 1
    for _ in range(40):
        deep = [deep]
    with pytest.raises(InvalidInput, match="nested more than 32 deep"):
        schema_safety.errors(schema, {"a": deep}, "modified args", "invalid_args")


def test_a_schema_stored_before_these_checks_is_a_422_when_applied_not_a_500() -> None:
    """Requests made before the checks may hold a remote `$ref` or a backreference."""
    for schema in (
        {"type": "object", "properties": {"to": {"$ref": "https://example.com/s.json"}}},
        {"type": "object", "properties": {"to": {"pattern": "(a)\\1"}}},
    ):
        with pytest.raises(InvalidInput) as err:
            check_args(schema, {"to": "aa"})
        assert err.value.code == "invalid_args"
