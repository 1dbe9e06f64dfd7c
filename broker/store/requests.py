"""Requests: creating them (alone or a run's round at once), reading, listing, noting history.

Creating is one Lua step per partition (create.lua, run by `broker.store.creating`): the hash, the
expiry and listing indexes, the count and the `approval.requested` event are written together
or not at all. An approval a policy rule covers is created already decided in that same step
(`rule_decided`). Deciding is `decisions`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from broker.domain.errors import InvalidInput, NotFound
from broker.domain.ids import new_ids, round_request_id
from broker.domain.models import HistoryEntry, NewRequest, Request, Status
from broker.redis.replies import as_str
from broker.store.creating import Creating
from broker.store.handles import Store
from broker.store.listing import Filter, Listing, Page
from broker.store.request_hash import history_json, parse_request
from broker.store.rule_store import RuleStore


class Requests:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.rules = RuleStore(
            store.redis, store.config, prefix=store.keys.prefix, keys=store.keys.rules
        )
        self.creating = Creating(store, self.rules)
        self.listing = Listing(store, self.get_requests)

    def create_request(self, new: NewRequest, *, created_by: str | None = None) -> Request:
        """Create a standalone request (no run): stored, indexed for expiry, and announced.

        Its creator (`NewRequest.created_by`, which the API sets to its caller) is stored and
        indexed in the same step, so the creator sees its request from the first moment
        (`api.visibility`). `created_by=` is the same thing said another way: it sets
        `NewRequest.created_by`.
        """
        [request] = self.create_requests([new], created_by=created_by)
        return request

    def create_requests(
        self, news: Sequence[NewRequest], *, created_by: str | None = None
    ) -> list[Request]:
        """Create many standalone requests in one atomic step (bulk import, load tests).

        Each is indexed under its own creator (`NewRequest.created_by`; `created_by=` sets it
        for every one). On a Redis Cluster, one step per partition (`broker.store.keys`): each
        partition's requests are created all or none, in the order given; every request is
        checked before any step is taken.
        """
        if created_by is not None:
            copies: dict[int, NewRequest] = {}
            for new in news:
                if id(new) not in copies:
                    copies[id(new)] = new.model_copy(update={"created_by": created_by})
            news = [copies[id(new)] for new in news]
        news = list(news)
        if not news:
            return []
        ids = new_ids("req", len(news))
        keys = self.store.keys
        if keys.partitions <= 1:
            return self.creating.create(None, 0, ids, news)[1]
        prepared = self.creating.prepare(None, 0, news)  # all checked before any is written
        groups: dict[int, tuple[list[str], list[NewRequest]]] = {}
        for rid, new in zip(ids, news, strict=True):
            group = groups.setdefault(keys.partition_of_request(rid), ([], []))
            group[0].append(rid)
            group[1].append(new)
        made: dict[str, Request] = {}
        for group_ids, group_news in groups.values():
            part = self.creating.create(None, 0, group_ids, group_news, prepared)
            made |= {r.id: r for r in part[1]}
        return [made[rid] for rid in ids]

    def create_round(
        self,
        run_id: str,
        round_no: int,
        calls: Sequence[NewRequest],
        *,
        agent: str | None = None,
    ) -> list[Request]:
        """Register every pending call of one round of a run at once; `agent` (the run's, when
        the caller has it) saves reading it for the rules scoped to agents.

        Idempotent per (run, round): a retried job that registers the same round again gets the
        requests already stored, and nothing is announced twice.
        """
        if not calls:
            raise InvalidInput("a round needs at least one pending call")
        if agent:
            self.creating.know_agent(run_id, agent)
        ids = [round_request_id(run_id, round_no, i) for i in range(len(calls))]
        code, requests = self.creating.create(run_id, round_no, ids, list(calls))
        if code == "exists":
            return self.round_requests(run_id, round_no)
        return requests

    def get_request(self, request_id: str) -> Request:
        raw = self.store.redis.hgetall(self.store.keys.request(request_id))
        if not raw:
            raise NotFound(f"no request with id {request_id!r}")
        return parse_request(raw)

    def get_requests(self, ids: Iterable[str]) -> list[Request]:
        """The requests of `ids` that exist, in order (one round trip)."""
        pipe = self.store.redis.pipeline(transaction=False)
        for rid in ids:
            pipe.hgetall(self.store.keys.request(rid))
        return [parse_request(raw) for raw in pipe.execute() if raw]

    def list_requests(
        self, *, status: Status | str | None = None, queue: str | None = None, limit: int = 100
    ) -> list[Request]:
        """The first page of `list_page`: pending ones soonest to expire first; otherwise the
        most recently created or decided first."""
        return self.list_page(status=status, queue=queue, limit=limit).items

    def list_page(
        self,
        *,
        status: Status | str | None = None,
        queue: str | None = None,
        run_id: str | None = None,
        created_by: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
        keep: Callable[[Request], bool] | None = None,
    ) -> Page:
        """One page of requests from the index that answers the filters (`broker.store.listing`);
        `keep` filters further (who may see what), reading a bounded number of entries."""
        f = Filter(Status(status) if status else None, queue, run_id, created_by)
        return self.listing.page(f, limit=limit, cursor=cursor, keep=keep)

    def round_requests(self, run_id: str, round_no: int) -> list[Request]:
        key = self.store.keys.run_round(run_id, round_no)
        return self.get_requests(as_str(i) for i in self.store.redis.lrange(key, 0, -1))

    def add_history(self, request_id: str, entry: HistoryEntry | str, *, pipe: Any = None) -> None:
        """Append to a request's history (deliveries, for example) in one atomic step.

        `entry` may be JSON text already; with `pipe` the step is queued on that pipeline.
        """
        text = entry if isinstance(entry, str) else history_json(entry)
        self.store.scripts.note(request_id, text, keys=self.store.keys, client=pipe)

    def pending_counts(self, queues: list[str]) -> dict[str, int]:
        """How many requests wait in each of `queues`, fleet-wide: one HMGET per partition."""
        pending = dict.fromkeys(queues, 0)
        if not queues:
            return pending
        for keys in self.store.keys.parts():
            counts = self.store.redis.hmget(keys.counts, [f"pending:{q}" for q in queues])
            for queue, count in zip(queues, counts, strict=True):
                pending[queue] += max(int(count or 0), 0)
        return pending

    def add_delivery_note(self, request_id: str, entry: str, *, pipe: Any = None) -> None:
        """A delivery's history note (JSON text with `event` and `channel`) and, with the audit
        trail on, its audit entry (event `delivered` / `delivery_failed`, actor the channel), in
        one step on the request's partition (note.lua)."""
        keys = self.store.keys
        if not keys.audit_keep_s:
            self.add_history(request_id, entry, pipe=pipe)
            return
        note = json.loads(entry)
        channel = str(note.get("channel") or "")
        self.store.scripts.run(
            "note",
            keys.shadow_keys(request_id),
            client=pipe,
            entry=entry,
            event=str(note.get("event", "")),
            request_id=request_id,
            actor=channel,
            actor_kind="system",
            detail=channel,
        )

    def counts(self) -> dict[str, int]:
        """Fleet-wide request counts kept by the Lua steps: `pending:QUEUE` (now waiting) and
        `STATUS:QUEUE` (outcomes so far)."""
        total: dict[str, int] = {}
        for keys in self.store.keys.parts():  # one hash per partition, summed
            for k, v in self.store.redis.hgetall(keys.counts).items():
                total[as_str(k)] = total.get(as_str(k), 0) + int(v)
        return total
