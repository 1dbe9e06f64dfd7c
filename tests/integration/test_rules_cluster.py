"""Policy rules on a single Redis and on a Redis Cluster (issue 19), one test each.

On a cluster the rule keys share one hash tag of their own (`{PREFIXrules}`), so a rule's
create, revoke and config sync are single-slot transactions; the create step (the request's
slot) is given the verdict matched in Python from the cached rule set, with the rules' version
checked first so a revoked rule is never applied by a create that starts after the revoke.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from redis import Redis
from redis.cluster import RedisCluster

from broker.domain.config import Config
from broker.domain.errors import Conflict
from broker.domain.models import Decision, NewRequest, Outcome, Status
from broker.domain.principals import Principal
from broker.facade import Broker
from broker.judge import Judge
from broker.rules import parse_body, sync_at_start

CONFIG = {
    "queues": {"default": {"channels": ["inbox"]}},
    "agents": {"refunds": {"path": "refunds_demo:agent"}},
    "approvers": {"pat": {"roles": ["policy"]}, "alice": {"roles": ["finance"]}},
    "rules": [{"id": "lookups", "effect": "allow", "tool": "lookup"}],
}
PAT = Principal("pat", frozenset({"policy"}))


@pytest.fixture(params=["single", "cluster"])
def client(request: pytest.FixtureRequest) -> Iterator[Redis | RedisCluster]:
    if request.param == "single":
        yield request.getfixturevalue("redis")
    else:
        yield request.getfixturevalue("cluster_client")


API_CONFIG = CONFIG


def broker_on(client: Redis | RedisCluster, cfg: Config) -> Broker:
    """A broker as one more process of the fleet would make it (its own rule cache)."""
    broker = Broker(client, cfg, prefix="t:")
    sync_at_start(broker.requests.rules)
    return broker


def test_rule_keys_share_one_tag_on_a_cluster_and_none_on_a_single_redis(client, cfg):
    keys = broker_on(client, cfg).keys.rules
    names = [keys.rule("r1"), keys.by_tool("refund"), keys.globs, keys.listing, keys.version]
    names.append(keys.hits)
    if isinstance(client, RedisCluster):
        assert all(n.startswith("{t:rules}:") for n in names)
        assert len({client.keyslot(n) for n in names}) == 1
    else:
        assert all(n.startswith("t:rule") for n in names)


def test_config_rule_decides_at_create_and_counts_its_hit(client, cfg):
    broker = broker_on(client, cfg)
    made = broker.create_requests(
        [NewRequest(tool_name="lookup", args={"q": str(i)}) for i in range(5)]
    )
    assert {r.status for r in made} == {Status.approved}
    assert all(r.decision and r.decision.rule == "lookups" for r in made)
    assert made == broker.get_requests(r.id for r in made)  # as stored, without a read back
    assert broker.requests.rules.get("lookups").hits == 5
    assert client.hget(broker.keys.rules.hits, "allow:lookups") == b"5"
    other = broker.create_request(NewRequest(tool_name="refund", args={"amount": 5}))
    assert other.status is Status.pending


def test_a_rule_revoked_by_another_process_is_not_applied_by_a_later_create(client, cfg):
    creator, admin = broker_on(client, cfg), broker_on(client, cfg)
    rule = admin.requests.rules.create(
        parse_body({"effect": "deny", "tool": "wire", "reason": "no wires"}), created_by="pat"
    )
    first = creator.create_request(NewRequest(tool_name="wire", args={"amount": 1}))
    assert first.status is Status.rejected  # the creator's cache now holds the rule
    admin.requests.rules.revoke(rule.id)
    second = creator.create_request(NewRequest(tool_name="wire", args={"amount": 2}))
    assert second.status is Status.pending
    assert creator.requests.rules.get(rule.id).hits == 1


def test_a_rule_made_by_another_process_applies_to_the_next_create(client, cfg):
    creator, admin = broker_on(client, cfg), broker_on(client, cfg)
    before = creator.create_request(NewRequest(tool_name="ping", args={"host": "a"}))
    assert before.status is Status.pending
    admin.requests.rules.create(parse_body({"effect": "allow", "tool": "ping"}), created_by="p")
    after = creator.create_request(NewRequest(tool_name="ping", args={"host": "b"}))
    assert after.status is Status.approved


def test_remembering_on_a_run_decides_it_and_its_covered_sibling(client, cfg):
    broker = broker_on(client, cfg)
    run = broker.create_run("refunds", "go").id
    first, second = broker.create_round(
        run,
        1,
        [
            NewRequest(tool_name="refund", args={"n": 1}),
            NewRequest(tool_name="refund", args={"n": 2}),
        ],
    )
    done = Judge(broker).decide(
        first.id, Decision(outcome=Outcome.approved), PAT, via={"inbox"}, remember=0
    )
    assert done.request.status is Status.approved
    assert done.rule is not None and done.rule.run_id == run
    assert done.siblings == (second.id,)
    assert broker.get_request(second.id).status is Status.approved
    assert broker.requests.rules.get(done.rule.id).hits == 1
    assert broker.get_run(run).status.value == "queued"
    resumes = [entry for keys in broker.keys.parts() for entry in client.xrange(keys.resumes)]
    assert len(resumes) == 1  # the round resumed once


def test_remembering_a_request_decided_meanwhile_keeps_no_rule_and_decides_nothing(client, cfg):
    broker = broker_on(client, cfg)
    run = broker.create_run("refunds", "go").id
    [req] = broker.create_round(run, 1, [NewRequest(tool_name="refund", args={"n": 1})])
    judge = Judge(broker)
    rules_before = len(broker.requests.rules.list())
    # decided by someone else after the service read it pending, before its step ran; and,
    # while the losing remember is in flight, a call its rule would cover is created
    scripts = broker.store.scripts
    real_run = scripts.run
    later: list[str] = []

    def racing_run(name, *args, **kwargs):
        if name == "remember":
            broker.decide(req.id, Decision(outcome=Outcome.rejected, reason="no"), decided_by="bob")
            [other] = broker.create_round(run, 2, [NewRequest(tool_name="refund", args={"n": 1})])
            later.append(other.id)
        return real_run(name, *args, **kwargs)

    scripts.run = racing_run  # type: ignore[method-assign]
    with pytest.raises(Conflict):
        try:
            judge.decide(req.id, Decision(outcome=Outcome.approved), PAT, via={"inbox"}, remember=0)
        finally:
            scripts.run = real_run  # type: ignore[method-assign]
    assert len(broker.requests.rules.list()) == rules_before
    assert broker.get_request(req.id).status is Status.rejected
    assert broker.get_request(later[0]).status is Status.pending  # the loser's rule decided nothing


def test_a_round_every_call_of_which_a_rule_decides_resumes_once(client, cfg):
    broker = broker_on(client, cfg)
    broker.requests.rules.create(
        parse_body({"effect": "allow", "tool": "refund", "agent": "refunds"}), created_by="pat"
    )
    run = broker.create_run("refunds", "go").id
    calls = [NewRequest(tool_name="refund", args={"n": n}) for n in range(3)]
    made = broker.create_round(run, 1, calls)
    assert {r.status for r in made} == {Status.approved}
    assert made == broker.get_requests(r.id for r in made)
    assert broker.create_round(run, 1, calls) == made  # a retried job: the same, nothing new
    resumes = [entry for keys in broker.keys.parts() for entry in client.xrange(keys.resumes)]
    assert len(resumes) == 1
    assert broker.get_run(run).status.value == "queued"
