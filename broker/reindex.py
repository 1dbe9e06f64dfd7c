"""Fill the listing indexes from requests stored before they existed (an upgrade step).

Reads the `requests` index a batch at a time and hands each batch to one Lua step
(reindex.lua), which reads every request again inside the step, so live traffic can't be
indexed wrongly. Running it twice does no harm. Run: `uv run python -m broker.reindex`.

On a Redis Cluster it goes partition by partition: a partition's `requests` index, its
requests, their runs' request sets and its own listing indexes share one hash tag, so each
step touches one slot (a single Redis has one partition, as before).
"""

from __future__ import annotations

from functools import cached_property

from redis.commands.core import Script

from broker.facade import Broker
from broker.redis.replies import as_members, as_str
from broker.store.keys import Keys
from broker.store.scripts import source

BATCH = 500


class Reindex:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    @cached_property
    def _script(self) -> Script:
        return self.broker.redis.register_script(source("reindex"))

    def run(self) -> int:
        """Index every stored request, one partition after another; the number indexed."""
        return sum(self._partition(part) for part in self.broker.keys.parts())

    def _partition(self, part: Keys) -> int:
        total, start = 0, 0
        while True:
            got = as_members(self.broker.redis.zrange(part.requests, start, start + BATCH - 1))
            if not got:
                return total
            total += self._batch(part, [as_str(i) for i in got])
            start += BATCH

    def _batch(self, part: Keys, ids: list[str]) -> int:
        """One step over `ids`, all listed in `part`'s index (and so stored in `part`)."""
        redis, keys = self.broker.redis, self.broker.keys
        ids = [rid for rid in ids if keys.partition_of_request(rid) == part.at]
        if not ids:
            return 0
        pipe = redis.pipeline(transaction=False)
        for rid in ids:
            pipe.hmget(keys.request(rid), "created_by", "run_id")
        script_keys = part.reindex_keys(self.broker.config.queues)
        for rid, (creator, run_id) in zip(ids, pipe.execute(), strict=True):
            script_keys.of_request(rid, "req", keys.request(rid))
            if creator:
                script_keys.of_request(rid, "creator", part.by_creator(as_str(creator)))
            if run_id and keys.partition_of_run(as_str(run_id)) == part.at:
                script_keys.of_request(rid, "run_requests", keys.run_requests(as_str(run_id)))
        return int(self._script(keys=script_keys.keys, args=[script_keys.args(ids=ids)]))


def main() -> None:
    count = Reindex(Broker.from_settings()).run()
    print(f"indexed {count} requests")


if __name__ == "__main__":
    main()
