"""The rule store on a real Redis: create, read, list filters, revoke, the tool index and the
version cache, config rules loaded idempotently, and a revoke racing matching and hits."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from redis import Redis

from broker.domain.config import Config
from broker.domain.errors import ConfigError, InvalidInput, NotFound
from broker.domain.rules.config_rules import parse_config_rules
from broker.domain.rules.matching import Call
from broker.domain.rules.models import parse_body
from broker.store.keys import Keys
from broker.store.rule_store import RuleExists, RuleStore, active_match
from broker.store.rule_sync import sync_config_rules

CONFIG = {
    "queues": {"default": {}, "managers": {}},
    "agents": {"refunds": {"path": "pkg.mod:agent"}, "files": {"path": "pkg.mod:agent"}},
}


API_CONFIG = CONFIG


@pytest.fixture
def store(redis: Redis, cfg: Config) -> RuleStore:
    return RuleStore(redis, cfg, prefix="t:")


def add(store: RuleStore, **body):
    body.setdefault("effect", "allow")
    body.setdefault("tool", "refund")
    return store.create(parse_body(body), created_by="pat")


def test_create_get_and_the_hash_it_is_kept_in(store: RuleStore, redis: Redis) -> None:
    rule = add(store, agent="refunds", args={"amount": {"le": 100}}, reason="small ones")
    assert rule.id.startswith("rule_") and rule.hits == 0 and rule.revoked_at is None
    again = store.get(rule.id)
    assert again == rule
    assert redis.sismember("t:rules:tool:refund", rule.id)
    assert redis.hget(f"t:rule:{rule.id}", "expires_at") is None
    with pytest.raises(NotFound):
        store.get("rule_nope")


def test_a_taken_id_an_unknown_agent_or_queue_write_nothing(store: RuleStore, redis: Redis) -> None:
    add(store, id="mine")
    before = {k: redis.type(k) for k in redis.keys("t:*")}
    version = redis.get("t:rules:version")
    with pytest.raises(RuleExists):
        add(store, id="mine", effect="deny")
    with pytest.raises(InvalidInput, match="^agent: agent 'ghost' is not defined"):
        add(store, agent="ghost")
    with pytest.raises(InvalidInput, match="^queue: queue 'nowhere' is not defined"):
        add(store, queue="nowhere")
    assert {k: redis.type(k) for k in redis.keys("t:*")} == before
    assert redis.get("t:rules:version") == version
    assert store.get("mine").effect == "allow"


def test_an_agent_registered_at_run_time_may_be_named(store: RuleStore, redis: Redis) -> None:
    redis.sadd(Keys("t:").agents, "late")
    assert add(store, agent="late").agent == "late"


def test_list_filters_and_revoke_keeps_the_rule_listed(store: RuleStore) -> None:
    a = add(store, agent="refunds")
    b = add(store, run_id="run_1")
    c = add(store, tool="fs_*", agent="files")
    d = add(store, tool="wire", expires_at=(datetime.now(UTC) + timedelta(hours=1)).isoformat())
    ids = lambda rules: [r.id for r in rules]  # noqa: E731
    assert ids(store.list()) == [d.id, c.id, b.id, a.id]
    assert ids(store.list(agent="refunds")) == [a.id]
    assert ids(store.list(run_id="run_1")) == [b.id]
    assert ids(store.list(tool="refund")) == [b.id, a.id]
    assert ids(store.list(tool="fs_write")) == [c.id]
    assert ids(store.list(limit=2)) == [d.id, c.id]
    revoked = store.revoke(b.id)
    assert revoked.revoked_at is not None
    assert store.revoke(b.id).revoked_at == revoked.revoked_at  # a second revoke changes nothing
    assert ids(store.list(active=True)) == [d.id, c.id, a.id]
    assert ids(store.list(active=False)) == [b.id]
    assert ids(store.list()) == [d.id, c.id, b.id, a.id]
    assert store.get(b.id).revoked_at == revoked.revoked_at


def test_candidates_read_the_tool_index_and_globs_only(store: RuleStore) -> None:
    a = add(store, agent="refunds")
    g = add(store, tool="re*", run_id="run_1")
    add(store, tool="wire")
    add(store, tool="fs_*")
    assert {r.id for r in store.candidates("refund")} == {a.id, g.id}
    assert {r.id for r in store.candidates("wire")} == {r.id for r in store.list(tool="wire")}
    assert store.candidates("nothing") == []


def test_the_cache_rereads_only_when_the_version_moves(store: RuleStore, redis: Redis, cfg) -> None:
    a = add(store, agent="refunds")
    call = Call("refund", agent="refunds")
    assert store.match(call) == ("allow", a)
    # an edit behind the store's back, without a version bump, is not seen: the cache is used
    redis.hset(f"t:rule:{a.id}", "effect", "deny")
    assert store.match(call)[0] == "allow"
    # any create or revoke bumps the version, and every store (another process) re-reads
    other = RuleStore(redis, cfg, prefix="t:")
    assert other.match(call)[0] == "deny"
    b = add(store, run_id="run_9", effect="deny")
    assert store.match(call)[0] == "deny"
    store.revoke(a.id)
    assert store.match(call) is None
    assert other.match(Call("refund", run_id="run_9")) == ("deny", b)


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def test_expired_rules_stop_matching_and_leave_the_index(redis: Redis, cfg: Config) -> None:
    clock = Clock()
    store = RuleStore(redis, cfg, prefix="t:", clock=clock)
    soon = datetime.fromtimestamp(clock.now + 60, UTC)
    r = add(store, expires_at=soon.isoformat())
    assert store.match(Call("refund"))[1].id == r.id
    assert store.hit(r.id)
    clock.now += 61  # past it (at exactly 60 the microsecond rounding of expires_at decides)
    assert store.match(Call("refund")) is None  # the cached rule is checked against the clock
    assert not store.hit(r.id)
    add(store, tool="other")  # a version bump: the store re-reads and prunes the index
    assert store.match(Call("refund")) is None
    assert not redis.sismember("t:rules:tool:refund", r.id)
    assert [x.id for x in store.list(active=False)] == [r.id]
    with pytest.raises(InvalidInput, match="^expires_at: is already past"):
        add(store, expires_at=soon.isoformat())


def test_hit_counts_and_refuses_revoked(store: RuleStore) -> None:
    r = add(store)
    assert store.hit(r.id) and store.hit(r.id)
    got = store.get(r.id)
    assert got.hits == 2 and got.last_hit_at is not None
    store.revoke(r.id)
    assert not store.hit(r.id)
    assert store.get(r.id).hits == 2
    assert not store.hit("rule_gone")


def test_a_revoke_racing_matching_and_hits_leaves_no_hit_after_it(store: RuleStore, redis, cfg):
    """Threads keep matching and hitting a rule while another thread revokes it: every hit
    counted was taken before the revoke (the hits in the revoked hash equal the final hits),
    and no match started after the revoke returned chooses the rule."""
    rule = add(store, agent="refunds")
    call = Call("refund", agent="refunds")
    revoked_done = threading.Event()
    stop = threading.Event()
    late_choices: list[str] = []
    counted = [0] * 4

    def matcher(i: int) -> None:
        mine = RuleStore(redis, cfg, prefix="t:")  # its own cache, as another API process
        while not stop.is_set():
            after_revoke = revoked_done.is_set()
            found = active_match(mine, call)
            if found is not None:
                counted[i] += 1
                if after_revoke:
                    late_choices.append(found[1].id)

    threads = [threading.Thread(target=matcher, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 10
    while sum(counted) < 200 and time.monotonic() < deadline:
        time.sleep(0.005)
    at_revoke = store.revoke(rule.id)
    revoked_done.set()
    until = time.monotonic() + 0.3
    while time.monotonic() < until:
        time.sleep(0.01)
    stop.set()
    for t in threads:
        t.join(10)
    final = store.get(rule.id)
    assert sum(counted) >= 200
    assert late_choices == []
    assert final.hits == at_revoke.hits == sum(counted)


# --- the config's [[rules]] ---------------------------------------------------------------


def test_config_rules_are_checked_naming_the_key(cfg: Config) -> None:
    good = {"id": "small", "effect": "allow", "tool": "refund", "args": {"amount": {"le": 50}}}
    cases = [
        (
            {"args": {"amount": {"between": [1, 2]}}},
            "rules[1].args.amount: unknown matcher 'between'",
        ),
        ({"agent": "ghost"}, "rules[1].agent: agent 'ghost' is not defined"),
        ({"queue": "nowhere"}, "rules[1].queue: queue 'nowhere' is not defined"),
        ({"id": None}, "rules[1].id: required in the config"),
        ({"id": "small"}, "rules[1].id: 'small' is used by an earlier rule"),
        ({"run_id": "run_1"}, "rules[1].run_id: a config rule can't name a run"),
        ({"tool": ""}, "rules[1].tool:"),
        ({"when": "always"}, "rules[1].when: unknown key"),
        ({"args": {"n": {"gt": "x"}}}, "rules[1].args.n.gt: must be a number"),
    ]
    for extra, message in cases:
        second = {**good, "id": "other", **extra}
        second = {k: v for k, v in second.items() if v is not None}
        with pytest.raises(ConfigError) as info:
            parse_config_rules([good, second], cfg)
        assert info.value.detail.startswith(f"config: {message}"), info.value.detail
    with pytest.raises(ConfigError, match=r"must be an array of tables"):
        parse_config_rules({"id": "x"}, cfg)
    rules = parse_config_rules([good, {**good, "id": "big", "effect": "deny"}], cfg)
    assert [(r.id, r.created_by) for r in rules] == [("small", "config"), ("big", "config")]


def test_config_rules_load_idempotently_and_a_dropped_one_is_revoked(
    store: RuleStore, redis: Redis, cfg: Config
) -> None:
    raw = [
        {"id": "small", "effect": "allow", "tool": "refund", "args": {"amount": {"le": 50}}},
        {"id": "no-wires", "effect": "deny", "tool": "wire", "reason": "never"},
    ]
    assert sync_config_rules(store, parse_config_rules(raw, cfg)) is True
    store.hit("small")
    first_created = store.get("small").created_at
    version = redis.get("t:rules:version")
    assert sync_config_rules(store, parse_config_rules(raw, cfg)) is False
    assert redis.get("t:rules:version") == version
    assert store.get("small").hits == 1 and store.get("small").created_by == "config"
    assert store.match(Call("wire"))[1].reason == "never"
    with pytest.raises(InvalidInput) as info:
        store.revoke("small")
    assert info.value.code == "config_rule"
    # the file changes: one rule edited (hits kept), one dropped (revoked, kept listed)
    edited = [{**raw[0], "args": {"amount": {"le": 20}}}]
    assert sync_config_rules(store, parse_config_rules(edited, cfg)) is True
    assert store.get("small").hits == 1
    assert store.get("small").created_at == first_created
    assert store.match(Call("refund", args={"amount": 30})) is None
    assert store.match(Call("wire")) is None
    assert store.get("no-wires").revoked_at is not None
    # put back: active again
    sync_config_rules(store, parse_config_rules(raw, cfg))
    assert store.match(Call("wire"))[0] == "deny"


def test_a_config_id_taken_by_an_api_rule_is_refused(store: RuleStore, cfg: Config) -> None:
    add(store, id="small", agent="refunds")
    rules = parse_config_rules([{"id": "small", "effect": "deny", "tool": "x"}], cfg)
    with pytest.raises(ConfigError, match="id 'small' is taken by a rule 'pat' made"):
        sync_config_rules(store, rules)
    assert store.get("small").effect == "allow"


def test_the_readme_rules_example_is_a_valid_policy(cfg: Config) -> None:
    import re
    import tomllib
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "docs" / "policy-rules.md").read_text()
    [example] = re.findall(r"```toml rules\n(.*?)```", readme, flags=re.S)
    [rule] = parse_config_rules(tomllib.loads(example)["rules"], cfg)
    assert rule.effect == "deny" and rule.args == {"amount": {"gt": 10000}}
