"""One node of the local Redis Cluster: its process, and how it sees the others (CLUSTER NODES).

Split from `broker.redis.local_cluster` so the launcher reads as the forming and fault steps only.
Like the embedded server, a node is private: its password is given on stdin (`requirepass` and
`masterauth`), its directory is 0700 and its files 0600. It never listens beyond loopback.
"""

from __future__ import annotations

import signal
import socket
import subprocess
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from redis import Redis
from redis.exceptions import RedisError

from broker.redis.durability import DEFAULT_FSYNC
from broker.redis.embedded import EmbeddedRedisError, find_redis_server, private_dir

BUS_OFFSET = 10000  # the cluster bus listens on port + 10000


class LocalClusterError(EmbeddedRedisError):
    code = "local_cluster"


def free_cluster_port(avoid: Collection[int] = ()) -> int:
    """A free loopback port whose cluster bus port (port + 10000) is free too, neither of them
    in `avoid` (the ports of nodes started already, which a free-port check doesn't see while
    such a node is still starting)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port + BUS_OFFSET > 65535 or port in avoid or port + BUS_OFFSET in avoid:
            continue
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + BUS_OFFSET))
        except OSError:
            continue
        return port
    raise LocalClusterError("no free port pair (port, port + 10000) on loopback")


@dataclass
class NodeView:
    """One line of CLUSTER NODES: who a node thinks another node is."""

    node_id: str
    port: int
    flags: frozenset[str]
    master_id: str | None
    slots: tuple[str, ...]

    @property
    def is_master(self) -> bool:
        return "master" in self.flags

    @property
    def failing(self) -> bool:
        return bool(self.flags & {"fail", "fail?", "pfail", "noaddr", "handshake"})


def parse_nodes(text: str) -> dict[str, NodeView]:
    views = {}
    for line in text.strip().splitlines():
        fields = line.split()
        address = fields[1].split("@", 1)[0]
        views[fields[0]] = NodeView(
            node_id=fields[0],
            port=int(address.rsplit(":", 1)[1] or 0),
            flags=frozenset(fields[2].split(",")) - {"myself"},
            master_id=None if fields[3] == "-" else fields[3],
            slots=tuple(s for s in fields[8:] if not s.startswith("[")),
        )
    return views


class Node:
    """One redis-server of the cluster, in its own directory, on its own port."""

    def __init__(self, data_dir: Path, port: int, password: str, node_timeout_ms: int) -> None:
        self.data_dir = data_dir
        self.port = port
        self.password = password
        self.node_timeout_ms = node_timeout_ms
        self.process: subprocess.Popen[bytes] | None = None

    def client(self, timeout: float = 2.0) -> Redis:
        return Redis(
            port=self.port,
            password=self.password,
            socket_connect_timeout=0.5,
            socket_timeout=timeout,
            decode_responses=True,
        )

    def start(self) -> None:
        private_dir(self.data_dir)
        args = [
            find_redis_server(),
            "-",  # the password comes on stdin, out of `ps`' sight
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.data_dir),
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(self.node_timeout_ms),
            # a replica may take over however long it was cut off: a test kills at will
            "--cluster-replica-validity-factor", "0",
            "--appendonly", "yes",
            "--appendfsync", DEFAULT_FSYNC,  # as the embedded server: fsynced before answered
            "--save", "",
            "--daemonize", "no",
            "--logfile", str(self.data_dir / "redis.log"),
        ]  # fmt: skip
        self.process = subprocess.Popen(
            args, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            start_new_session=True, umask=0o077,
        )  # fmt: skip
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(
                f"requirepass {self.password}\nmasterauth {self.password}\n".encode()
            )
            self.process.stdin.close()
        except BrokenPipeError:
            pass  # it exited at once: `answers` reports it

    def answers(self) -> bool:
        if self.process is None or self.process.poll() is not None:
            err = (
                self.process.stderr.read().decode().strip()
                if self.process and self.process.stderr
                else ""
            )
            log = self.data_dir / "redis.log"
            tail = log.read_text().strip().splitlines()[-1:] if log.exists() else []
            raise LocalClusterError(
                f"redis-server on port {self.port} exited ({err or ' '.join(tail) or 'no output'})"
            )
        client = self.client()
        try:
            return bool(client.ping())
        except RedisError:
            return False
        finally:
            client.close()

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        if self.alive:
            assert self.process is not None
            self.process.kill()
            self.process.wait()
        self.process = None

    def stop(self) -> None:
        if self.alive:
            assert self.process is not None
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
