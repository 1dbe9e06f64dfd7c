"""What the chat surfaces' fuzz suites share: one bounded hypothesis setting, strategies of
hostile JSON (wrong types, numbers past 64 bits, long and odd text, deep nesting) and of
hostile header values, mutations of a valid body, and the check that a hostile body got a
clean answer and changed nothing in Redis.

Each suite sends what a platform could sign (signed with the test secrets where the surface
checks a signature first), so the fuzz reaches the parsers behind the check. The requests it
clicks on can't be decided by any body it makes: they wait in a queue no chat decides, or are
decided already; so "nothing changed" is exact (only the replay markers a handled body spends,
`seen:*`, may appear).
"""

from __future__ import annotations

import copy
import json
import os
from typing import Any

from httpx import Response
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from broker.domain.models import Decision, NewRequest, Outcome
from broker.facade import Broker

FUZZ = settings(
    max_examples=int(os.environ.get("APPROVAL_BROKER_FUZZ_EXAMPLES", "300")),
    deadline=None,  # a request through the app: its time is not what this checks
    database=None,
    print_blob=True,  # a failure in CI prints the @reproduce_failure line to replay it
    suppress_health_check=list(HealthCheck),
)
"""Each property's budget: 300 bodies, a few seconds on a CI machine (set
`APPROVAL_BROKER_FUZZ_EXAMPLES` to search longer on a machine of your own)."""

DEEP = "__deep__"
"""A string a mutation may put anywhere; `dumps` turns it into arrays nested 3,000 deep (built
as text: `json.dumps` itself would recurse too deep)."""

HOSTILE_TEXT = ["", " ", "\u202e", "\x00", "💥" * 50, "x" * 10_001, "9" * 400, DEEP]
HUGE_NUMBERS = [2**63, -(2**63) - 1, 2**64, 10**400, -(10**400), 1e308, -0.0, 1.5]
hostile_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from(HUGE_NUMBERS),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=30),
    st.sampled_from(HOSTILE_TEXT),
)
json_values = st.recursive(
    hostile_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)

header_text = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=80)
hostile_timestamps = st.one_of(
    st.integers(min_value=1, max_value=500).map(lambda n: "9" * n),
    st.integers(min_value=1, max_value=500).map(lambda n: "-" + "9" * n),
    st.integers().map(str),
    st.sampled_from(["", "1.7e9", "0x10", "+1700000000", " 1700000000", "NaN"]),
    header_text,
)
"""Timestamp header values no platform sends (latin-1 text, as HTTP carries it)."""


def paths_of(value: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a JSON document (the root is `()`)."""
    out = [at]
    if isinstance(value, dict):
        for key, child in value.items():
            out += paths_of(child, (*at, key))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            out += paths_of(child, (*at, i))
    return out


def _set(doc: Any, path: tuple[Any, ...], value: Any, delete: bool = False) -> Any:
    if not path:
        return value
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return doc


def containers_of(doc: Any) -> list[tuple[Any, ...]]:
    """The places in `doc` that hold an object or an array: where a wrong type breaks most."""
    return [p for p in paths_of(doc) if isinstance(_get(doc, p), dict | list)]


def alike(value: Any) -> st.SearchStrategy[Any]:
    """Hostile values of `value`'s own JSON type: they pass a type check and meet what is
    behind it (a huge id, an odd string, an object with keys nobody expects)."""
    if isinstance(value, bool):
        return st.booleans()
    if isinstance(value, int):
        return st.integers() | st.sampled_from([v for v in HUGE_NUMBERS if isinstance(v, int)])
    if isinstance(value, float):
        return st.floats(allow_nan=False, allow_infinity=False)
    if isinstance(value, str):
        return st.text(max_size=40) | st.sampled_from(HOSTILE_TEXT)
    if isinstance(value, dict):
        return st.dictionaries(st.text(max_size=8), json_values, max_size=3).map(
            lambda extra: {**value, **extra}
        )
    if isinstance(value, list):
        return st.lists(json_values, max_size=3)
    return json_values


@st.composite
def mutated(draw: st.DrawFn, bases: list[dict[str, Any]], fills: Fills) -> Any:
    """One of `bases` with up to three places (never the whole body: the suites send bodies of
    any kind apart) replaced by a hostile value of another type or of the same type, deleted,
    or wrapped in a list (the right value in the wrong type); half the time the place is one
    holding an object or array. A base's `{name}` strings of `fills` (e.g. `"{rid}"`) are first
    replaced by one of their values (a list to pick from, or a strategy), so the shapes and
    the things they name vary apart; with no change past that, the body is a valid one."""
    doc: Any = _fill(draw, copy.deepcopy(draw(st.sampled_from(bases))), fills)
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        places = containers_of(doc) if draw(st.booleans()) else paths_of(doc)
        places = [p for p in places if p]
        if not places:
            break
        path = draw(st.sampled_from(places))
        how = draw(st.sampled_from(["other", "alike", "alike", "delete", "wrap"]))
        if how == "delete":
            doc = _set(doc, path, None, delete=True)
        elif how == "wrap":
            doc = _set(doc, path, [_get(doc, path)])
        elif how == "alike":
            doc = _set(doc, path, draw(alike(_get(doc, path))))
        else:
            doc = _set(doc, path, draw(json_values))
    return doc


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        doc = doc[key]
    return doc


Fills = dict[str, list[Any] | st.SearchStrategy[Any]]


def _draw_fill(draw: st.DrawFn, fill: list[Any] | st.SearchStrategy[Any]) -> Any:
    return draw(st.sampled_from(fill) if isinstance(fill, list) else fill)


def _fill(draw: st.DrawFn, doc: Any, fills: Fills) -> Any:
    """`doc` with each `"{name}"` of `fills` replaced by a drawn value (of the value's own type),
    and each longer string holding `{name}` formatted with one."""
    if isinstance(doc, dict):
        return {k: _fill(draw, v, fills) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_fill(draw, v, fills) for v in doc]
    if isinstance(doc, str) and "{" in doc:
        if doc.startswith("{") and doc.endswith("}") and doc[1:-1] in fills:
            return _draw_fill(draw, fills[doc[1:-1]])
        names = [n for n in fills if "{" + n + "}" in doc]
        if names:
            return doc.format(**{n: _draw_fill(draw, fills[n]) for n in names})
    return doc


def dumps(doc: Any) -> bytes:
    """The document as JSON text, with `DEEP` strings turned into 3,000-deep arrays."""
    text = json.dumps(doc)
    return text.replace(json.dumps(DEEP), "[" * 3000 + "]" * 3000).encode()


def snapshot(broker: Broker) -> dict[bytes, bytes | None]:
    """Every key of the test's database and its serialized value (DUMP), but replay markers."""
    keys = sorted(k for k in broker.redis.scan_iter(count=1000) if b":seen:" not in k)
    pipe = broker.redis.pipeline(transaction=False)
    for key in keys:
        pipe.dump(key)
    return dict(zip(keys, pipe.execute(), strict=True))


def assert_unchanged(
    broker: Broker, before: dict[bytes, bytes | None], requests: dict[str, str]
) -> None:
    """Redis as `before` (a `snapshot`), and the waiting requests still waiting without votes."""
    assert snapshot(broker) == before
    for name in ("held", "held_question"):
        request = broker.get_request(requests[name])
        assert request.is_pending and request.approvals == []


def assert_clean_answer(resp: Response, *, empty_ok: tuple[int, ...] = ()) -> None:
    """No 5xx; a 4xx is `{"error", "detail"}` JSON; any other answer is JSON (or an empty body
    where the platform expects one, `empty_ok`)."""
    assert resp.status_code < 500, (resp.status_code, resp.text[:300])
    if resp.status_code in empty_ok and not resp.content:
        return
    assert resp.headers.get("content-type", "").startswith("application/json"), resp.headers
    body = resp.json()
    if resp.status_code >= 400:
        assert isinstance(body, dict) and {"error", "detail"} <= set(body), body


QUESTIONS = [
    {"question": "Which size?", "header": "Size", "options": [{"label": "S"}, {"label": "M"}]}
]
ANSWER = {"answers": [{"question": "Which size?", "selected": ["S"], "other": None}]}


def undecidable_requests(broker: Broker, *, held: str, decided: str) -> dict[str, str]:
    """Requests no fuzzed body can decide, by name: an approval and a structured question
    waiting in `held` (a queue no chat decides), and one of each decided already by bob in
    `decided` (a queue the chats decide: clicks get as far as the decision step)."""
    approval = {"tool_name": "refund", "args": {"amount": 5}}
    question = {"tool_name": "size", "kind": "question", "metadata": {"questions": QUESTIONS}}
    ids = {
        "held": broker.create_request(NewRequest(**approval, queue=held)).id,
        "held_question": broker.create_request(NewRequest(**question, queue=held)).id,
    }
    approved = broker.create_request(NewRequest(**approval, queue=decided))
    broker.decide(approved.id, Decision(outcome=Outcome.approved), decided_by="bob")
    answered = broker.create_request(NewRequest(**question, queue=decided))
    broker.decide(answered.id, Decision(outcome=Outcome.answered, answer=ANSWER), decided_by="bob")
    ids.update(decided=approved.id, decided_question=answered.id)
    return ids
