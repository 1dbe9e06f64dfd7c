"""The local Redis Cluster the harness starts, and what the broker's cluster layer relies on.

It forms (3 masters, 3 replicas, every slot served), a cluster client spreads keys over every
master, a hash-tagged multi-key script runs while a cross-slot one is refused, and a SIGKILLed
master's replica takes over with every write that `wait_for_replicas` confirmed; the patient
client waits through the promotion where redis-py's own retries give up.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from redis import Redis
from redis.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import AskError, ClusterCrossSlotError, MovedError
from redis.exceptions import ConnectionError as RedisConnectionError

from broker.redis.cluster import (
    FailedOver,
    NotReplicated,
    PatientCluster,
    connect_cluster,
    marker_key,
    wait_for_replicas,
)
from broker.redis.local_cluster import SLOTS, LocalCluster, LocalClusterError

MOVE = (Path(__file__).resolve().parents[1] / "support" / "lua" / "cluster_move.lua").read_text()


def node_client(cluster: LocalCluster, i: int) -> Redis:
    return Redis(port=cluster.nodes[i].port, password=cluster.password)


def slots_of(cluster: LocalCluster, i: int) -> set[int]:
    """The slots node `i` serves, by its own CLUSTER SLOTS."""
    client = node_client(cluster, i)
    try:
        port = cluster.nodes[i].port
        return {
            slot
            for lo, hi, master, *_ in client.execute_command("CLUSTER", "SLOTS")
            if int(master[1]) == port
            for slot in range(lo, hi + 1)
        }
    finally:
        client.close()


def keys_on(cluster: LocalCluster, i: int, n: int, prefix: str) -> list[str]:
    """`n` keys whose slots node `i` serves."""
    mine = slots_of(cluster, i)
    keys: list[str] = []
    k = 0
    while len(keys) < n:
        key = f"{prefix}:{k}"
        if key_slot(key.encode()) in mine:
            keys.append(key)
        k += 1
    return keys


def test_the_cluster_forms_with_three_masters_each_replicated_and_every_slot_served(
    redis_cluster: LocalCluster,
) -> None:
    redis_cluster.wait_ready()
    masters = redis_cluster.masters()
    assert len(masters) == 3
    assert len(redis_cluster.nodes) == 6
    for m in masters:
        assert len(redis_cluster.replicas_of(m)) == 1, m
    served = [slots_of(redis_cluster, m) for m in masters]
    assert sum(len(s) for s in served) == SLOTS
    assert set().union(*served) == set(range(SLOTS))
    replica = redis_cluster.replicas_of(masters[0])[0]
    with pytest.raises(LocalClusterError, match="not a master"):
        redis_cluster.kill_master(replica)
    assert redis_cluster.nodes[replica].alive
    # private: a node refuses a client without the password
    anonymous = Redis(port=redis_cluster.nodes[0].port)
    with pytest.raises(Exception, match="NOAUTH|[Aa]uthenticat"):
        anonymous.ping()
    anonymous.close()


def test_a_cluster_client_spreads_keys_over_every_master(
    redis_cluster: LocalCluster, cluster_client: RedisCluster
) -> None:
    for k in range(300):
        cluster_client.set(f"spread:{k}", k)
    counts = {}
    for m in redis_cluster.masters():
        client = node_client(redis_cluster, m)
        counts[m] = client.dbsize()
        client.close()
    assert sum(counts.values()) == 300
    assert all(count > 0 for count in counts.values()), counts
    assert [int(cluster_client.get(f"spread:{k}")) for k in range(300)] == list(range(300))


def test_a_hash_tagged_multi_key_script_runs_and_a_cross_slot_one_is_refused(
    redis_cluster: LocalCluster, cluster_client: RedisCluster
) -> None:
    move = cluster_client.register_script(MOVE)
    cluster_client.set("ab:{r1}:pending", "payload")
    assert move(keys=["ab:{r1}:pending", "ab:{r1}:decided"]) == b"payload"
    assert cluster_client.get("ab:{r1}:decided") == b"payload"
    assert cluster_client.exists("ab:{r1}:pending") == 0

    # untagged keys of two slots: the server that owns the first refuses the script
    a, b = "ab:req:r1", "ab:req:r2"
    assert key_slot(a.encode()) != key_slot(b.encode())
    cluster_client.set(a, "payload")
    owner = cluster_client.get_node_from_key(a)
    assert owner is not None and owner.redis_connection is not None
    with pytest.raises(ClusterCrossSlotError):  # the server's CROSSSLOT reply
        owner.redis_connection.eval(MOVE, 2, a, b)
    assert cluster_client.get(a) == b"payload"  # refused whole: nothing moved


def test_marker_keys_share_the_slot_of_their_key() -> None:
    for key in ("ab:{r1}:req", "plain", "ab:req:r9"):
        marker = marker_key(key)
        assert marker != key
        assert key_slot(marker.encode()) == key_slot(key.encode()), key
    assert marker_key("ab:{r1}:req").startswith("ab:{r1}:")
    with pytest.raises(ValueError, match="hash tag"):  # an empty tag hashes the whole key
        marker_key("{}odd")


def test_wait_for_replicas_counts_acks_and_refuses_too_few(
    cluster_client: RedisCluster,
) -> None:
    cluster_client.set("ab:{w}:x", "1")
    assert wait_for_replicas(cluster_client, "ab:{w}:x") == 1
    # each master has one replica: asking for two times out with one ack
    with pytest.raises(NotReplicated) as refused:
        wait_for_replicas(cluster_client, "ab:{w}:x", numreplicas=2, timeout_ms=100)
    assert refused.value.acked == 1
    assert wait_for_replicas(cluster_client, "ab:{w}:x", 2, 100, strict=False) == 1


def test_a_killed_masters_replica_takes_over_with_every_waited_write(
    redis_cluster: LocalCluster, cluster_client: RedisCluster
) -> None:
    victim = redis_cluster.masters()[0]
    keys = keys_on(redis_cluster, victim, 200, "durable")
    confirmed = []
    for i, key in enumerate(keys):
        cluster_client.set(key, i)
        if i % 2 == 0:  # half the writes are waited for, as decisions and rounds would be
            wait_for_replicas(cluster_client, key)
            confirmed.append(key)
    assert len(confirmed) == 100

    promoted = redis_cluster.kill_master(victim)
    try:
        assert promoted in redis_cluster.masters()
        assert victim not in redis_cluster.masters()
        # the same client, with no new startup nodes, finds the new master and keeps working
        survived = [k for k in confirmed if cluster_client.get(k) is not None]
        assert survived == confirmed, f"{len(confirmed) - len(survived)} waited writes lost"
        assert all(int(cluster_client.get(k)) == keys.index(k) for k in confirmed)
        for key in keys:
            cluster_client.set(key, "after")
        assert {cluster_client.get(k) for k in keys} == {b"after"}
        assert cluster_client.get_node_from_key(keys[0]).port == redis_cluster.nodes[promoted].port
    finally:
        redis_cluster.restart(victim)
    # it came back as a replica of the node that took over
    assert victim in redis_cluster.replicas_of(promoted)


def test_a_patient_client_rides_out_a_failover_that_a_plain_one_does_not(
    redis_cluster: LocalCluster, cluster_client: RedisCluster
) -> None:
    """Right after a master dies the cluster still names it for the seconds until a replica is
    promoted: redis-py's own retries are spent by then; the roles' patient client backs off."""
    victim = redis_cluster.masters()[0]
    (key,) = keys_on(redis_cluster, victim, 1, "patient")
    cluster_client.set(key, "before")
    wait_for_replicas(cluster_client, key)
    plain = connect_cluster(redis_cluster.url)
    patient = connect_cluster(redis_cluster.url, patient=True)
    assert isinstance(patient, PatientCluster) and not isinstance(plain, PatientCluster)
    assert plain.get(key) == patient.get(key) == b"before"  # both know the layout
    replica = redis_cluster.replicas_of(victim)[0]
    redis_cluster.nodes[victim].kill()
    try:
        with pytest.raises(RedisConnectionError):
            plain.get(key)
        started = time.monotonic()
        pipe = patient.pipeline(transaction=False)
        pipe.get(key)
        pipe.set(key, "after")
        assert pipe.execute() == [b"before", True]  # waited for the promotion, then ran
        assert time.monotonic() - started > 0.5  # it did have to wait
        assert patient.get(key) == b"after"
        assert patient.get_node_from_key(key).port == redis_cluster.nodes[replica].port
    finally:
        plain.close()
        patient.close()
        redis_cluster.wait_ready(60)
        redis_cluster.restart(victim, 60)


class CancelOnRetry(logging.Handler):
    """Calls `cancel` when the patient client logs that it is riding something out."""

    def __init__(self, cancel: object) -> None:
        super().__init__()
        self.cancel = cancel
        self.retried = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.retried += 1
        self.cancel()  # type: ignore[operator]


def test_a_patient_transaction_rides_out_a_slot_that_redirects_until_it_settles(
    redis_cluster: LocalCluster, cluster_client: RedisCluster
) -> None:
    """A slot half migrated answers ASK from its source and MOVED from its target: redis-py's
    transaction follows neither for long and raises, as it did in CI while a failover
    settled (a tool's kept result was lost and its run failed). The patient client reads the
    slot map again and sends the transaction again (nothing ran: the EXEC was aborted) until
    the slot settles; here the migration is cancelled when it says it is waiting."""
    source = redis_cluster.masters()[0]
    target = redis_cluster.masters()[1]
    src, dst = node_client(redis_cluster, source), node_client(redis_cluster, target)
    (key,) = keys_on(redis_cluster, source, 1, "migrating")
    slot = key_slot(key.encode())

    def migrate() -> None:
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src.execute_command("CLUSTER", "MYID"))  # fmt: skip
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst.execute_command("CLUSTER", "MYID"))  # fmt: skip

    def settle() -> None:
        for node in (src, dst):
            node.execute_command("CLUSTER", "SETSLOT", slot, "STABLE")

    plain = connect_cluster(redis_cluster.url)
    patient = connect_cluster(redis_cluster.url, patient=True)
    handler = CancelOnRetry(settle)
    logging.getLogger("broker.redis.cluster").addHandler(handler)
    try:
        migrate()
        with pytest.raises((AskError, MovedError)), plain.pipeline(transaction=True) as pipe:
            pipe.hset(key, "kept", "1")
            pipe.hincrby(key, "running", -1)
            pipe.execute()
        assert plain.hgetall(key) == {}  # the aborted EXEC applied nothing
        with patient.pipeline(transaction=True) as pipe:
            pipe.hset(key, "kept", "1")
            pipe.hincrby(key, "running", -1)
            assert pipe.execute() == [1, -1]  # once: the retried EXEC was the first to apply
        assert handler.retried >= 1  # it did wait for the slot to settle
        assert patient.hgetall(key) == {b"kept": b"1", b"running": b"-1"}
    finally:
        logging.getLogger("broker.redis.cluster").removeHandler(handler)
        settle()
        for client in (plain, patient, src, dst):
            client.close()


def test_a_wait_whose_master_failed_over_does_not_vouch_for_the_write(
    redis_cluster: LocalCluster, cluster_client: RedisCluster
) -> None:
    """A step's write, then its master dies before the WAIT: the new master never saw the
    write, so a WAIT there would count a replica for a write that is gone. It raises instead
    (a connection error: the API answers 503, the roles retry the step)."""
    victim = redis_cluster.masters()[0]
    (key,) = keys_on(redis_cluster, victim, 1, "vouch")
    client = connect_cluster(redis_cluster.url)
    client.get(key)  # it knows the layout: the key's master is `victim`
    redis_cluster.nodes[victim].kill()
    try:
        with pytest.raises(FailedOver, match="try again"):
            wait_for_replicas(client, key, strict=False)
        assert client.get_node_from_key(key).port != redis_cluster.nodes[victim].port
        client.set(key, "again")  # the caller's retry of the step lands on the new master
        assert wait_for_replicas(client, key, strict=False) == 0  # no replica left
    finally:
        client.close()
        redis_cluster.wait_ready(60)
        redis_cluster.restart(victim, 60)


def test_a_shard_fails_over_twice_back_to_the_first_node_with_every_waited_write(
    tmp_path: Path,
) -> None:
    """Kill a master, restart it (it rejoins as the new master's replica), kill the new master:
    the first node takes its slots back (node index 0, which the harness once took for "not
    promoted yet"), and every write waited for on either master is there."""
    with LocalCluster(tmp_path, masters=3) as cluster:
        client = connect_cluster(cluster.url, patient=True)
        keys = keys_on(cluster, 0, 40, "twice")
        for key in keys[:20]:
            client.set(key, "one")
            wait_for_replicas(client, key)
        first = cluster.kill_master(0)
        cluster.restart(0)
        assert 0 in cluster.replicas_of(first)
        for key in keys[20:]:
            client.set(key, "two")
            wait_for_replicas(client, key)
        assert cluster.kill_master(first) == 0
        assert [client.get(k) for k in keys] == [b"one"] * 20 + [b"two"] * 20
        client.close()


def test_a_node_whose_port_pair_was_taken_meanwhile_starts_on_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the free-port check and redis-server's bind, another process may take the bus
    port (port + 10000): that node exits with "Failed listening" and is started again on
    another pair, and the cluster forms."""
    import socket

    from broker.redis import local_cluster
    from broker.redis.cluster_node import BUS_OFFSET, free_cluster_port

    held: list[socket.socket] = []
    first: list[int] = []

    def taken_meanwhile(avoid: object = ()) -> int:
        port = free_cluster_port(avoid)  # type: ignore[arg-type]
        if not held:  # the first pair: someone binds its bus port right after the check
            squatter = socket.socket()
            squatter.bind(("127.0.0.1", port + BUS_OFFSET))
            squatter.listen()
            held.append(squatter)
            first.append(port)
        return port

    monkeypatch.setattr(local_cluster, "free_cluster_port", taken_meanwhile)
    try:
        with LocalCluster(tmp_path, masters=1, replicas_per_master=0) as cluster:
            assert cluster.nodes[0].port != first[0]
            assert len(slots_of(cluster, 0)) == SLOTS
            assert (tmp_path / "node-0").exists()  # the failed start's directory, left aside
            assert cluster.nodes[0].data_dir == tmp_path / "node-0-1"
    finally:
        for squatter in held:
            squatter.close()
