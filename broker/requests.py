"""Requests: creating them (alone or a run's round at once), reading, listing, noting history.

Creating is one Lua step (create.lua): the hash, the expiry and listing indexes, the count and
the `approval.requested` event are written together or not at all. Deciding is `decisions`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from broker.args_schema import check_schema
from broker.errors import InvalidInput, NotFound
from broker.ids import new_id, round_request_id
from broker.listing import Filter, Listing, Page
from broker.models import HistoryEntry, NewRequest, Request, Status
from broker.questions import validate_question_metadata
from broker.quorum import creation_fields
from broker.request_hash import history_json, parse_request, request_fields
from broker.store import Store
from broker.text import as_str


class Requests:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.listing = Listing(store, self.get_requests)

    def create_request(self, new: NewRequest, *, created_by: str | None = None) -> Request:
        """Create a standalone request (no run): stored, indexed for expiry, and announced.

        `created_by` (the API's caller) is stored and indexed in the same step, so the creator
        sees its request from the first moment (`api.visibility`).
        """
        [request] = self.create_requests([new], created_by=created_by)
        return request

    def create_requests(
        self, news: Sequence[NewRequest], *, created_by: str | None = None
    ) -> list[Request]:
        """Create many standalone requests in one atomic step (bulk import, load tests).

        On a Redis Cluster, one step per partition (`broker.keys`): each partition's requests
        are created all or none, in the order given.
        """
        built = [(new_id("req"), new) for new in news]
        if not built:
            return []
        groups: dict[int, list[tuple[str, NewRequest]]] = {}
        for item in built:
            groups.setdefault(self.store.keys.partition_of_request(item[0]), []).append(item)
        made: dict[str, Request] = {}
        for group in groups.values():
            made |= {r.id: r for r in self._create(None, 0, group, created_by)[1]}
        return [made[rid] for rid, _ in built]

    def create_round(
        self, run_id: str, round_no: int, calls: Sequence[NewRequest]
    ) -> list[Request]:
        """Register every pending call of one round of a run at once.

        Idempotent per (run, round): a retried job that registers the same round again gets the
        requests already stored, and nothing is announced twice.
        """
        if not calls:
            raise InvalidInput("a round needs at least one pending call")
        built = [(round_request_id(run_id, round_no, i), call) for i, call in enumerate(calls)]
        code, requests = self._create(run_id, round_no, built)
        if code == "exists":
            return self.round_requests(run_id, round_no)
        return requests

    def _check(self, new: NewRequest) -> float:
        """Refuse a request nothing can serve; its timeout in seconds."""
        config = self.store.config
        self.store.check_queue(new.queue)
        validate_question_metadata(new.metadata, kind=new.kind)
        if new.callback is not None and new.callback not in config.webhooks:
            raise InvalidInput(
                f"callback webhook {new.callback!r} is not defined", code="unknown_webhook"
            )
        if new.args_schema is not None:
            check_schema(new.args_schema)
        return new.timeout_s if new.timeout_s is not None else config.timeout_for(new.queue)

    def _create(
        self,
        run_id: str | None,
        round_no: int,
        built: list[tuple[str, NewRequest]],
        created_by: str | None = None,
    ) -> tuple[str, list[Request]]:
        if created_by is None:  # or as the requests say (the API sets NewRequest.created_by)
            creators = {new.created_by for _, new in built if new.created_by}
            created_by = creators.pop() if len(creators) == 1 else None
        items: list[dict[str, Any]] = []
        for rid, new in built:
            timeout = self._check(new)
            fields = request_fields(new, rid, run_id, round_no) | creation_fields(
                new, self.store.config
            )
            if created_by:
                fields["created_by"] = created_by
            items.append({"id": rid, "timeout_s": timeout, "fields": fields})
        keys = self.store.keys.create_keys(
            run_id, round_no, [rid for rid, _ in built], {new.queue for _, new in built}
        )
        self.store.keys.creator_keys(keys, created_by)
        result = self.store.scripts.run(
            "create",
            keys,
            maxlen=self.store.maxlen,
            retention=self.store.retention,
            round=str(round_no),
            requests=items,
        )
        if result[0] == "duplicate":
            raise InvalidInput(f"request {result[1]} already exists", code="duplicate")
        if result[0] != "ok":
            return str(result[0]), []
        # the requests as just written, without reading them back
        requests = [
            parse_request(
                {**item["fields"], "id": item["id"], "created_at": result[1], "expires_at": expires}
            )
            for item, expires in zip(items, result[2:], strict=True)
        ]
        return "ok", requests

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
        """One page of requests from the index that answers the filters (`broker.listing`);
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

    def counts(self) -> dict[str, int]:
        """Fleet-wide request counts kept by the Lua steps: `pending:QUEUE` (now waiting) and
        `STATUS:QUEUE` (outcomes so far)."""
        total: dict[str, int] = {}
        for keys in self.store.keys.parts():  # one hash per partition, summed
            for k, v in self.store.redis.hgetall(keys.counts).items():
                total[as_str(k)] = total.get(as_str(k), 0) + int(v)
        return total
