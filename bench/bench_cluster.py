"""What Redis Cluster costs here: WAIT for a replica per write, and cluster vs single-node Redis.

Prints, on a local cluster (3 masters + 3 replicas, `broker.redis.local_cluster.LocalCluster`) and an
embedded single Redis started in the same run:
  - SET/s from one client, plain, and each followed by `wait_for_replicas` (what a decision,
    a round or a resume that must survive a failover would pay), and one wait per 100 SETs;
  - pipelined script calls/s (a two-key hash-tagged script) on the single Redis and the cluster;
  - the broker's own create + decide cycles/s: single Redis, cluster (each create and decide
    step waits for a replica), and cluster with those waits switched off (their cost);
  - Redis CPU per cycle (INFO cpu of each node before and after, less what the nodes burn idle
    in the same time): the single Redis, the 3 masters together (each cycle lands on one) and
    their replicas; and what that makes one master carry, cycles/s at one core.
Cycles/s from one client are latency-bound on a loaded machine; CPU ms per cycle is the figure
that scales (README, "Redis Cluster", has the worked estimate).
Run: `uv run python bench/bench_cluster.py [--n 5000]`.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from redis import Redis
from redis.cluster import RedisCluster

from broker.domain.config import parse_config
from broker.domain.models import Decision, NewRequest
from broker.facade import Broker
from broker.redis.cluster import connect_cluster, wait_for_replicas
from broker.redis.embedded import EmbeddedRedis
from broker.redis.local_cluster import LocalCluster
from broker.store import scripts

SCRIPT = (Path(__file__).parent / "lua" / "cluster_round.lua").read_text()
BATCH = 100


def per_s(n: int, fn: Callable[[int], object]) -> float:
    start = time.perf_counter()
    for i in range(n):
        fn(i)
    return n / (time.perf_counter() - start)


def set_rates(client: RedisCluster, n: int) -> dict[str, float]:
    def plain(i: int) -> None:
        client.set(f"bench:{{s{i}}}:v", i)

    def waited(i: int) -> None:
        key = f"bench:{{w{i}}}:v"
        client.set(key, i)
        wait_for_replicas(client, key)

    def batched(b: int) -> None:  # BATCH SETs of one tag, then one wait for them all
        for j in range(BATCH):
            client.set(f"bench:{{b{b}}}:{j}", j)
        wait_for_replicas(client, f"bench:{{b{b}}}:0")

    return {
        "SET/s, one client": per_s(n, plain),
        "SET + wait_for_replicas/s, one client": per_s(n, waited),
        f"SET/s with one wait per {BATCH}": per_s(n // BATCH, batched) * BATCH,
    }


def script_rate(client: Redis | RedisCluster, n: int) -> float:
    """Pipelined EVAL calls/s: redis-py's cluster pipeline has no EVALSHA or eval(): both send EVAL."""
    start = time.perf_counter()
    for i in range(0, n, BATCH):
        pipe = client.pipeline(transaction=False)
        for j in range(i, i + BATCH):
            keys = (f"bench:{{r{j}}}:req", f"bench:{{r{j}}}:n")
            pipe.execute_command("EVAL", SCRIPT, 2, *keys, "approved")
        pipe.execute()
    return n / (time.perf_counter() - start)


def broker_cycles(client: Redis | RedisCluster, n: int) -> float:
    """create_request + decide per second, one client (the broker's steps, WAITs included)."""
    broker = Broker(client, parse_config({"queues": {"default": {"channels": ["inbox"]}}}))

    def cycle(i: int) -> None:
        made = broker.create_request(NewRequest(tool_name="bench", args={"i": i}))
        broker.decide(made.id, Decision(outcome="approved"), decided_by="bench")

    return per_s(n, cycle)


def used_cpu_s(nodes: list[Redis]) -> float:
    """CPU seconds (user + sys) the nodes' Redis processes have used since they started."""
    total = 0.0
    for node in nodes:
        info = node.info("cpu")
        total += float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    return total


def idle_cpu_per_s(nodes: list[Redis], seconds: float = 2.0) -> float:
    """What the nodes burn doing nothing (cron, the cluster bus), per second of wall clock."""
    before, start = used_cpu_s(nodes), time.perf_counter()
    time.sleep(seconds)  # measuring an idle interval, not synchronising
    return (used_cpu_s(nodes) - before) / (time.perf_counter() - start)


def cycles_with_cpu(
    client: Redis | RedisCluster, cycles: int, groups: dict[str, list[Redis]]
) -> tuple[float, dict[str, float]]:
    """create + decide cycles/s, and each group's Redis CPU ms per cycle (idle use taken off)."""
    idle = {name: idle_cpu_per_s(nodes) for name, nodes in groups.items()}
    before = {name: used_cpu_s(nodes) for name, nodes in groups.items()}
    start = time.perf_counter()
    rate = broker_cycles(client, cycles)
    elapsed = time.perf_counter() - start
    cpu = {
        name: max(used_cpu_s(nodes) - before[name] - idle[name] * elapsed, 0.0) * 1e3 / cycles
        for name, nodes in groups.items()
    }
    return rate, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=5000, help="operations per measurement")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        with (
            LocalCluster(Path(tmp) / "cluster") as cluster,
            EmbeddedRedis(Path(tmp) / "single") as single,
        ):
            client = connect_cluster(cluster.url)
            print(
                f"local cluster of {len(cluster.nodes)} nodes, {args.n} operations each", flush=True
            )
            rates = set_rates(client, args.n)
            for name, rate in rates.items():
                print(f"cluster: {name:<40}: {rate:10,.0f}", flush=True)
            plain = rates["SET/s, one client"]
            waited = rates["SET + wait_for_replicas/s, one client"]
            print(
                f"cluster: cost of a wait per write: {1e3 / waited - 1e3 / plain:.2f} ms",
                flush=True,
            )
            single_client = Redis.from_url(single.url)
            on_single = script_rate(single_client, args.n)
            on_cluster = script_rate(client, args.n)
            print(f"pipelined script calls/s, single Redis : {on_single:10,.0f}", flush=True)
            print(f"pipelined script calls/s, cluster      : {on_cluster:10,.0f}", flush=True)
            print(f"cluster / single                       : {on_cluster / on_single:10.2f} x")
            cycles = max(args.n // 4, 50)
            masters = [cluster.nodes[i].client() for i in cluster.masters()]
            replicas = [
                node.client() for i, node in enumerate(cluster.nodes) if i not in cluster.masters()
            ]
            on_single, single_cpu = cycles_with_cpu(single_client, cycles, {"single": [single_client]})  # fmt: skip
            groups = {"masters": masters, "replicas": replicas}
            waited, waited_cpu = cycles_with_cpu(client, cycles, groups)
            kept, scripts.REPLICATED = scripts.REPLICATED, ()
            unwaited, unwaited_cpu = cycles_with_cpu(client, cycles, groups)
            scripts.REPLICATED = kept
            print(f"broker create+decide/s, single Redis   : {on_single:10,.0f}", flush=True)
            print(f"broker create+decide/s, cluster, WAIT  : {waited:10,.0f}", flush=True)
            print(f"broker create+decide/s, cluster, no WAIT: {unwaited:9,.0f}", flush=True)
            print(
                f"cost of the two waits per cycle        : {1e3 / waited - 1e3 / unwaited:.2f} ms"
            )
            print(f"Redis CPU per cycle ({cycles} cycles), ms:")
            print(f"  single Redis                         : {single_cpu['single']:10.3f}")
            for label, cpu in (("cluster, WAIT", waited_cpu), ("cluster, no WAIT", unwaited_cpu)):
                print(f"  {label + ', the 3 masters':<37}: {cpu['masters']:10.3f}")
                print(f"  {label + ', the 3 replicas':<37}: {cpu['replicas']:10.3f}")
            for label, ms in (("single Redis", single_cpu["single"]), ("one master", waited_cpu["masters"])):  # fmt: skip
                print(f"cycles/s one core carries, {label:<12}: {1e3 / ms:10,.0f}")
            for node in masters + replicas:
                node.close()
            single_client.close()
            client.close()


if __name__ == "__main__":
    main()
