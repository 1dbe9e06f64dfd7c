"""A webhook reply parsed from a kept template (`api.webhooks._plain_reply`) is the reply the
full validation gives, and anything it can't vouch for gets the full path's answer (issue 18).

Every body is parsed twice: by `parse_reply` (template first) and by the validation alone;
both must give an equal reply (fields, the decision it carries, the fields set) or the same
error (status, code, detail), whatever was parsed before.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

import api.webhooks as webhooks
from api.errors import ApiError
from api.schemas import WebhookReply


def full(body: bytes) -> Any:
    """What parse_reply answered before templates: validation, then the error mapping."""
    saved = webhooks._plain_reply
    webhooks._plain_reply = lambda body: None  # type: ignore[assignment]
    try:
        return outcome(body)
    finally:
        webhooks._plain_reply = saved


def outcome(body: bytes) -> Any:
    try:
        reply = webhooks.parse_reply(body)
    except ApiError as exc:
        return ("error", exc.status, exc.code, exc.detail)
    assert isinstance(reply, WebhookReply)
    return (
        "reply",
        reply.model_dump(),
        reply.to_decision().model_dump(),
        sorted(reply.model_fields_set),
    )


def j(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


BODIES: list[bytes] = [
    j(request_id="run_a.1.x", outcome="approved", decided_by="bot"),
    j(request_id="run_b.1.x", outcome="approved", decided_by="bot"),  # the same template
    j(request_id="run_c.1.x", outcome="approved"),
    j(request_id="run_d.1.x", outcome="rejected", reason="too much", decided_by="bot"),
    j(request_id="run_d.1.x", outcome="rejected", reason="", decided_by="bot"),
    j(request_id="run_e.1.x", outcome="approved", decided_by="a/b"),  # the pattern: 422
    j(request_id="run_e.1.x", outcome="approved", decided_by="tab\there"),
    j(request_id="run_e.1.x", outcome="approved", decided_by=""),
    j(request_id="run_e.1.x", outcome="approved", decided_by="x" * 101),
    j(request_id="run_e.1.x", outcome="approved", decided_by="x" * 100),
    j(request_id="run_f.1.x", outcome="approved", reason="r" * 10_001),
    j(request_id="run_f.1.x", outcome="approved", reason="r" * 10_000),
    j(request_id="", outcome="approved"),
    j(request_id="i" * 200, outcome="approved"),
    j(request_id="i" * 201, outcome="approved"),
    j(request_id="réq_é", outcome="approved", decided_by="zoë"),
    j(request_id="run_g.1.x", outcome="maybe"),
    j(request_id="run_g.1.x", outcome="timed_out"),
    j(request_id="run_g.1.x", outcome="modified"),
    j(request_id="run_g.1.x", outcome="modified", args={"amount": 1}),
    j(request_id="run_g.1.x", outcome="answered"),
    j(request_id="run_g.1.x", outcome="answered", answer="yes"),
    j(request_id="run_g.1.x", outcome="escalated"),
    j(request_id="run_g.1.x", outcome="escalated", target="senior"),
    j(request_id="run_g.1.x", outcome="approved", remember=0),
    j(request_id="run_g.1.x", outcome="approved", extra="x"),
    j(request_id="run_g.1.x", outcome="approved", decided_by=None),
    j(request_id="run_g.1.x", outcome="approved", reason=None),
    j(request_id=5, outcome="approved"),
    j(request_id=None, outcome="approved"),
    j(outcome="approved"),
    j(request_id="run_h.1.x"),
    j(request_id="run_h.1.x", outcome=1),
    b'{"request_id":"run_i.1.x","outcome":"rejected","outcome":"approved"}',  # the last wins
    b'{"request_id":"run_i.1.x","request_id":"run_j.1.x","outcome":"approved"}',
    b'{"request_id":"\\ud800","outcome":"approved"}',  # a lone surrogate
    b'{"request_id":"run_k.1.x","outcome":"approved","decided_by":"\\udfff"}',
    b'{"request_id":"run_k.1.x","outcome":"approved","reason":"\\ud83d\\ude00"}',
    b'{"request_id":"run_k.1.x","outcome":"approved","reason":"nul\\u0000"}',
    b'  {"request_id" : "run_l.1.x" , "outcome" : "approved"}  ',
    b'["run_l.1.x", "approved"]',
    b'"approved"',
    b"null",
    b"",
    b"{nope",
    b'{"request_id":"run_m.1.x","outcome":"approved"}x',
    b"\xff\xfe",
    b'{"request_id":"run_n.1.x","outcome":"approved","args":{"a":NaN}}',
    b'{"request_id":"run_n.1.x","outcome":"approved","args":{"a":1e999}}',
    b"[" * 5000 + b"]" * 5000,
]


@pytest.mark.parametrize("body", BODIES, ids=range(len(BODIES)))
def test_a_reply_parses_as_the_full_validation_parses_it(body: bytes) -> None:
    before = full(body)
    assert outcome(body) == before  # the first time: a template is made, or none
    assert outcome(body) == before  # again: from the template if one was kept


def test_templates_are_per_reply_and_carry_each_ones_own_id() -> None:
    one = webhooks.parse_reply(j(request_id="run_p.1.x", outcome="approved", decided_by="b"))
    two = webhooks.parse_reply(j(request_id="run_q.1.x", outcome="approved", decided_by="b"))
    three = webhooks.parse_reply(j(request_id="run_r.1.x", outcome="rejected", decided_by="b"))
    assert (one.request_id, two.request_id, three.request_id) == (
        "run_p.1.x",
        "run_q.1.x",
        "run_r.1.x",
    )
    assert one is not two and one.to_decision().outcome.value == "approved"
    assert three.to_decision().outcome.value == "rejected"
    assert len(webhooks._REPLIES) <= webhooks._REPLIES_KEPT


def test_the_common_reply_comes_from_a_template() -> None:
    body = j(request_id="run_s.1.x", outcome="approved", decided_by="fleet-bot")
    assert webhooks._plain_reply(body) is not None
    assert webhooks._plain_reply(j(request_id="run_s.1.x", outcome="approved", x=1)) is None
