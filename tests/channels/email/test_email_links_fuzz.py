"""`GET`/`POST /v1/email/{token}` under generated tokens and forms: no 5xx, and a refused link
changes nothing in Redis (the request still pending, no vote, no history entry, the nonce
unspent); a GET never changes anything.

Tokens: any text, a real link's token with one character changed, cut or extended, and links
signed with the real key but hostile claims (a made-up request id, recipient, nonce, queue or
escalation count), so the checks after the signature are reached too. Bounded: `MAX_EXAMPLES`.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.domain.models import NewRequest
from broker.facade import Broker
from channels.email.links import ACTIONS, new_nonce, sign_link
from tests.support.decisions import snapshot
from tests.support.hostile_json import UNICODE_TEXT, VALUES, dumps

MAX_EXAMPLES = 150
API_CONFIG = {
    "queues": {
        "default": {"channels": ["email:leads"], "escalate_to": "managers"},
        "managers": {"channels": ["email:leads"]},
        "pair": {"channels": ["email:leads"], "quorum": 2},
    },
    "email": {
        "public_url": "http://testserver",
        "link_ttl_s": 3600,
        "lists": {
            "leads": {"to": ["alice@example.com", "ext@example.com"], "unmapped_may_decide": True}
        },  # fmt: skip
    },
    "approvers": {"alice": {"roles": ["finance"], "email": "alice@example.com"}},
}
QUESTION = {
    "questions": [
        {
            "question": "Which?",
            "header": "Pick",
            "multi_select": False,
            "options": [{"label": "A"}, {"label": "B"}],
        }  # fmt: skip
    ]
}
TOKEN_CHARS = st.characters(codec="ascii", exclude_categories=["Cc"])


def seeded(broker: Broker) -> dict[str, str]:
    """Pending requests the links name: an approval in two queues and a question (three)."""
    made = {
        q: broker.create_request(NewRequest(tool_name="t", args={"a": 1}, queue=q)).id
        for q in ("default", "pair")
    }
    question = NewRequest(tool_name="ask", args={}, kind="question", metadata=QUESTION)
    made["question"] = broker.create_request(question).id
    return made


ADDRESSES = ["alice@example.com", "ext@example.com"]
RECIPES = st.one_of(
    st.tuples(
        st.just("text"), st.one_of(st.text(TOKEN_CHARS, min_size=1, max_size=200), UNICODE_TEXT)
    ),
    st.tuples(
        st.just("mutated"),
        st.integers(0, 2),  # which pending request
        st.sampled_from(ACTIONS),
        st.sampled_from(["flip", "cut", "extend"]),
        st.integers(0, 10_000),  # where (modulo the token's length)
        st.text(TOKEN_CHARS, min_size=1, max_size=8),
    ),
    st.tuples(
        st.just("claims"),
        st.one_of(st.integers(0, 2), UNICODE_TEXT),
        st.one_of(st.sampled_from(ADDRESSES), UNICODE_TEXT),
        st.sampled_from(ACTIONS),
        st.one_of(st.none(), UNICODE_TEXT),  # the nonce (None: a fresh one)
        st.one_of(st.none(), st.sampled_from(["default", "pair", "managers"]), UNICODE_TEXT),
        st.one_of(st.none(), st.integers(), st.sampled_from([2**64, -1])),
    ),
)
"""How to make a token (drawn as data; the token is made when the test runs, since a real
one carries the time and a fresh nonce)."""


def token_of(recipe: tuple[Any, ...], broker: Broker, ids: list[str]) -> str:
    kind = recipe[0]
    if kind == "text":
        return str(recipe[1])
    if kind == "mutated":
        _, which, action, change, at, extra = recipe
        real = sign_link(broker, ids[which], ADDRESSES[0], action, new_nonce())
        at %= len(real)
        if change == "cut":
            return real[:at]
        if change == "extend":
            return real + extra
        flipped = "A" if real[at] != "A" else "B"
        return real[:at] + flipped + real[at + 1 :]
    _, which, to, action, nonce, queue, escalations = recipe
    request_id = ids[which] if isinstance(which, int) else which
    return sign_link(
        broker, request_id, to, action, nonce or new_nonce(), queue=queue, escalations=escalations
    )


FORMS = st.dictionaries(
    st.sampled_from(["reason", "answer", "args_hash", "Which?", "other", "x"]),
    st.one_of(UNICODE_TEXT, VALUES.map(dumps)),
    max_size=4,
)


def test_no_link_gets_a_5xx_and_a_refused_one_changes_nothing(
    client: TestClient, api_broker: Broker
) -> None:
    ids = list(seeded(api_broker).values())
    seen: dict[int, int] = {}

    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(recipe=RECIPES, post=st.booleans(), form=FORMS)
    def run(recipe: tuple[Any, ...], post: bool, form: dict[str, str]) -> None:
        token = token_of(recipe, api_broker, ids)
        url = "/v1/email/" + quote(token, safe="")
        before = snapshot(api_broker.redis)
        resp = client.post(url, data=form) if post else client.get(url)
        seen[resp.status_code] = seen.get(resp.status_code, 0) + 1
        assert resp.status_code < 500, (token[:200], form, resp.text[:300])
        if resp.status_code >= 400 or not post:
            assert snapshot(api_broker.redis) == before, (token[:200], resp.status_code)
        if resp.status_code < 400 and post:  # decided or voted: the next links get a new one
            ids[:] = seeded(api_broker).values()

    run()
    print("statuses seen:", dict(sorted(seen.items())))
    assert seen.get(200) and (seen.get(403) or seen.get(410) or seen.get(404))
    for request_id in ids:
        assert api_broker.get_request(request_id).is_pending
