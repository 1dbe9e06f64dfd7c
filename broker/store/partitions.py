"""Partitions: which hash tag a key carries on a Redis Cluster, and the views per partition.

A run's keys and its requests' keys live in the partition of the run (a standalone request in
its own), beside that partition's indexes, streams, outbox and counts, so every Lua step touches
one slot. A single Redis has one partition and its key names carry no tag. This module does the
arithmetic only; it never names a key (that is `broker.store.keys`).
"""

from __future__ import annotations

import binascii
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Self

from broker.domain.ids import run_of_request

CLUSTER_PARTITIONS = 16
"""Partitions on a Redis Cluster (a single Redis has one, so its key names carry no tag)."""


def partition_of(owner: str, partitions: int) -> int:
    """The partition of a run (by its id) or of a standalone request (by its id)."""
    if partitions <= 1:
        return 0
    return binascii.crc_hqx(owner.encode(), 0) % partitions


@dataclass(frozen=True)
class Partitioned:
    """A key prefix split into `partitions` hash tags `{PREFIXpN}`, seen from partition `at`.

    `part(n)` is the view of another partition; `Keys` names every key on top of this."""

    prefix: str = "ab:"
    partitions: int = 1
    at: int = 0

    def base(self, partition: int | None = None) -> str:
        """What every key name of `partition` (default: `at`) starts with."""
        if self.partitions <= 1:
            return self.prefix
        return "{" + f"{self.prefix}p{self.at if partition is None else partition}" + "}:"

    def part(self, partition: int) -> Self:
        """This view as named in `partition` (its indexes, streams, outbox, counts)."""
        return self if partition == self.at else replace(self, at=partition)

    def parts(self) -> Iterator[Self]:
        """One view per partition, for readers that go through all of them."""
        for n in range(max(self.partitions, 1)):
            yield self.part(n)

    def partition_of_run(self, run_id: str) -> int:
        return partition_of(run_id, self.partitions)

    def partition_of_request(self, request_id: str) -> int:
        """A round's request lives with its run (`broker.domain.ids`), a standalone one by its id."""
        return partition_of(run_of_request(request_id) or request_id, self.partitions)

    def of_request(self, request_id: str) -> Self:
        return self.part(self.partition_of_request(request_id))

    def of_run(self, run_id: str) -> Self:
        return self.part(self.partition_of_run(run_id))

    def _req(self, request_id: str) -> str:
        return self.base(self.partition_of_request(request_id))

    def _run(self, run_id: str) -> str:
        return self.base(self.partition_of_run(run_id))

    def in_partition(self, key: str, partition: int) -> str:
        """`key` (named with no tag, e.g. a one-time marker) moved into `partition`;
        unchanged with one partition."""
        if self.partitions <= 1 or not key.startswith(self.prefix):
            return key
        return self.base(partition) + key.removeprefix(self.prefix)
