"""The audit trail on a Redis Cluster: one chain per partition (each appended in the step of
that partition, its keys under the partition's hash tag), and one for the rules' slot; every
chain verifies on its own and `AuditTrail` reads them all."""

from __future__ import annotations

from redis.cluster import RedisCluster

from broker.audit import AuditTrail, verify
from broker.domain.config import parse_config
from broker.domain.models import Decision, NewRequest
from broker.domain.rules.models import parse_body
from broker.facade import Broker


def test_each_partition_keeps_a_chain_of_its_own(cluster_client: RedisCluster) -> None:
    broker = Broker(cluster_client, parse_config({}), prefix="t:")
    keys = broker.keys
    assert keys.partitions > 1
    made = [broker.create_request(NewRequest(tool_name="t", args={"n": n})) for n in range(12)]
    for req in made:
        broker.decide(req.id, Decision(outcome="approved"), decided_by="alice")
    broker.requests.rules.create(parse_body({"effect": "allow", "tool": "x"}), created_by="pat")
    entries = list(AuditTrail(cluster_client, keys).entries())
    chains = {e.chain for e in entries}
    assert len(chains) > 2 and "rules" in chains  # several partitions, and the rules' own
    for req in made:
        mine = [e for e in entries if e.request_id == req.id]
        chain = f"p{keys.partition_of_request(req.id)}"
        assert [(e.event, e.chain) for e in mine] == [("created", chain), ("decided", chain)]
    for chain in chains:
        seqs = [e.seq for e in entries if e.chain == chain]
        assert seqs == list(range(1, len(seqs) + 1))
    assert verify(list(enumerate(entries, 1))) == (
        None, {c: sum(e.chain == c for e in entries) for c in chains},
    )  # fmt: skip
    view = keys.of_request(made[0].id)
    assert view.audit.startswith("{t:p") and view.audit_head.startswith(
        view.audit[: view.audit.index("}") + 1]
    )
