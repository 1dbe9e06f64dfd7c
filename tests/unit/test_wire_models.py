"""The models that travel over HTTP are defined once, in the client package: the server's
extend them (same fields, same JSON) and only narrow what they accept."""

from __future__ import annotations

from typing import Any

import approval_broker_client.models as wire
import pytest

import broker.domain.models as server

PAIRS = [
    (server.Decision, wire.Decision),
    (server.HistoryEntry, wire.HistoryEntry),
    (server.Vote, wire.Vote),
    (server.Request, wire.Request),
    (server.NewRequest, wire.NewRequest),
    (server.Run, wire.Run),
]
SERVER_ONLY = {"NewRequest": {"created_by"}}  # set by the broker, never sent by an app

STORED: dict[str, Any] = {
    "id": "r1",
    "tool_call_id": "c1",
    "tool_name": "refund",
    "args": {"order": 1},
    "args_hash": "h1",
    "created_at": "2024-01-01T00:00:00Z",
    "expires_at": "2024-01-01T01:00:00Z",
    "decision": {"outcome": "approved", "decided_by": "alice", "from_a_newer_broker": 1},
    "history": [{"at": "2024-01-01T00:00:01Z", "event": "delivered", "unknown": 2}],
    "quorum": 2,
    "approvals": [
        {"by": "alice", "at": "2024-01-01T00:00:02Z", "args_hash": "h1", "unknown": 3},
        {"by": "bob", "at": "2024-01-01T00:00:03Z", "args_hash": "h2"},
    ],
    "approvals_by_args": {"h1": 99},
    "unknown_top": 4,
}


@pytest.mark.parametrize(("mine", "theirs"), PAIRS, ids=[p[1].__name__ for p in PAIRS])
def test_the_server_model_extends_the_clients_and_writes_no_field_list_of_its_own(
    mine: type, theirs: type
) -> None:
    assert issubclass(mine, theirs)
    assert mine.__name__ == theirs.__name__  # the /openapi.json schema names stay
    extra = set(mine.model_fields) - set(theirs.model_fields)
    assert extra == SERVER_ONLY.get(mine.__name__, set())
    assert list(mine.model_fields)[: len(theirs.model_fields)] == list(theirs.model_fields)
    assert set(mine.model_computed_fields) == set(theirs.model_computed_fields)


def test_the_server_drops_unknown_fields_and_the_client_keeps_them() -> None:
    stored = server.Request.model_validate(STORED)
    dumped = stored.model_dump(mode="json")
    assert "unknown_top" not in dumped
    assert "from_a_newer_broker" not in dumped["decision"]
    assert "unknown" not in dumped["history"][0] and "unknown" not in dumped["approvals"][0]

    read = wire.Request.model_validate(STORED)
    assert read.model_dump(mode="json")["unknown_top"] == 4
    assert read.decision is not None and read.decision.model_extra == {"from_a_newer_broker": 1}


def test_both_sides_count_approvals_by_args_from_the_votes_and_give_the_same_json() -> None:
    stored = server.Request.model_validate(STORED)
    assert stored.approvals_by_args == {"h1": 1, "h2": 1}  # not the 99 it was handed
    read = wire.Request.model_validate_json(stored.model_dump_json())
    assert read.approvals_by_args == stored.approvals_by_args
    assert read.model_dump_json() == stored.model_dump_json()


def test_the_server_bounds_the_quorum_an_app_may_ask_the_client_leaves_it_to_the_broker() -> None:
    assert wire.NewRequest(tool_name="t", quorum=server.MAX_QUORUM + 1).quorum == 11
    with pytest.raises(ValueError, match="less than or equal to 10"):
        server.NewRequest(tool_name="t", quorum=server.MAX_QUORUM + 1)
