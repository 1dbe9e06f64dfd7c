"""Every key a Lua step touches arrives in KEYS, built by broker/store/keys.py (what Redis Cluster needs).

Standalone Redis does not enforce KEYS, so these tests run every step with a guard: each
`redis.call` in the scripts is routed through a check that its key was declared, and every
declared key carries the broker's prefix. A step that built a key name itself would fail here.
"""

from __future__ import annotations

import re
import time
from importlib.resources import files

import pytest
from redis import Redis
from redis.exceptions import ResponseError

import broker.store.scripts as scripts_module
from broker.domain.config import Config
from broker.domain.errors import Conflict, InvalidInput
from broker.domain.models import Decision, HistoryEntry, NewRequest, Status, utcnow
from broker.facade import Broker

PREFIX = "t:"
GUARD = """
local declared = {}
for _, k in ipairs(KEYS) do
  if string.sub(k, 1, %d) ~= '%s' then error('KEYS entry without the prefix: ' .. k) end
  declared[k] = true
end
local function checked_call(cmd, first, ...)
  if string.upper(cmd) == 'TIME' then return redis.call(cmd) end
  if not declared[first] then error('undeclared key ' .. tostring(first) .. ' in ' .. cmd) end
  return redis.call(cmd, first, ...)
end
"""


_source = scripts_module.source


def guarded(name: str) -> str:
    text = _source(name)
    assert "redis.call(" in text
    return GUARD % (len(PREFIX), PREFIX) + text.replace("redis.call(", "checked_call(")


@pytest.fixture
def checked(redis: Redis, config: Config, monkeypatch: pytest.MonkeyPatch) -> Broker:
    """A broker whose scripts refuse any key that is not in KEYS."""
    monkeypatch.setattr(scripts_module, "source", guarded)
    return Broker(redis, config, prefix=PREFIX)


def test_the_guard_catches_an_undeclared_key(checked: Broker) -> None:
    script = checked.redis.register_script(
        GUARD % (len(PREFIX), PREFIX) + "return checked_call('GET', 't:other')"
    )
    with pytest.raises(ResponseError, match="undeclared key t:other"):
        script(keys=["t:declared"])
    with pytest.raises(ResponseError, match="without the prefix"):
        script(keys=["elsewhere"])


def test_no_script_builds_a_key_name() -> None:
    here = files(scripts_module.__name__)
    for path in here.iterdir():
        if path.name.endswith(".lua"):
            text = path.read_text()
            assert "prefix" not in text, path.name
            assert not re.search(r"'(req|run|stream|seen):'", text), path.name


def test_every_step_touches_only_declared_keys(checked: Broker) -> None:
    broker = checked
    a, b, c = broker.create_requests([NewRequest(tool_name=n) for n in "abc"])
    broker.create_run("agent", "go", run_id="run1")
    calls = [NewRequest(tool_name="x"), NewRequest(tool_name="y", kind="question")]
    x, y = broker.create_round("run1", 1, calls)
    assert [r.id for r in broker.create_round("run1", 1, calls)] == [x.id, y.id]  # 'exists'
    once = (broker.keys.seen("webhook", "m1"), 60)
    assert broker.decide(a.id, Decision(outcome="approved"), decided_by="u", once=once).status
    with pytest.raises(Conflict):
        broker.decide(b.id, Decision(outcome="approved"), decided_by="u", once=once)
    with pytest.raises(Conflict):
        broker.decide(a.id, Decision(outcome="rejected"), decided_by="u")
    with pytest.raises(InvalidInput):
        broker.decide(y.id, Decision(outcome="approved"), decided_by="u")
    moved = broker.escalate(b.id, decided_by="u")
    with pytest.raises(Conflict):
        broker.decide(b.id, Decision(outcome="approved"), decided_by="u", in_queue="default")
    broker.add_history(c.id, HistoryEntry(at=utcnow(), event="delivered", channel="inbox"))
    broker.decide(x.id, Decision(outcome="rejected", reason="no"), decided_by="u")
    results = broker.sweep(now=time.time() + 100_000)  # c, y escalate; b times out
    assert {(r.request_id, r.action) for r in results} == {
        (b.id, "timed_out"),
        (c.id, "escalated"),
        (y.id, "escalated"),
    }
    results = broker.sweep(now=time.time() + 200_000)
    assert {(r.request_id, r.action) for r in results} == {(c.id, "timed_out"), (y.id, "timed_out")}
    assert broker.get_request(y.id).status is Status.timed_out
    assert moved.queue == "managers"
    assert broker.redis.xlen(broker.keys.resumes) == 1  # run1's round, once
    broker.sweep(now=time.time() + broker.retention + 300_000)  # the retention pass too
