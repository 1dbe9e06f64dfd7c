"""Requests: creating them (alone or a run's round at once), reading, listing, noting history.

Creating is one Lua step (create.lua): the hash, the expiry and listing indexes, the count and
the `approval.requested` event are written together or not at all. An approval a policy rule
covers is matched here and created already decided in that same step, which re-checks the rule
(`rule_decided`). Deciding is `decisions`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

from broker.args_schema import check_schema
from broker.errors import InvalidInput, NotFound
from broker.ids import new_id, round_request_id
from broker.listing import Filter, Listing, Page
from broker.models import HistoryEntry, NewRequest, Request, Status
from broker.questions import validate_question_metadata
from broker.quorum import creation_fields, quorum_of
from broker.request_hash import history_json, parse_request, request_fields
from broker.rule_decided import RuleVerdict, verdict_for
from broker.rules.matching import Call, suggested_rules
from broker.rules.store import RuleStore
from broker.store import Store
from broker.text import as_str

_RULE_TRIES = 5
"""Create calls at most while chosen rules keep changing under us (revoked meanwhile)."""


class Requests:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.rules = RuleStore(store.redis, store.config, prefix=store.keys.prefix)
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
        approvals = any(n.kind == "approval" for _, n in built)
        agent, version = self._agent_and_version(run_id) if approvals else (None, None)
        items: list[dict[str, Any]] = []
        calls: dict[str, Call] = {}
        for rid, new in built:
            timeout = self._check(new)
            suggested = None
            if new.kind == "approval":
                calls[rid] = replace(
                    Call.of(new, agent=agent), run_id=run_id, created_by=created_by
                )
                suggested = suggested_rules(new.tool_name, new.args, run_id, agent)
            fields = request_fields(new, rid, run_id, round_no, suggested) | creation_fields(
                new, self.store.config
            )
            if created_by:
                fields["created_by"] = created_by
            items.append({"id": rid, "timeout_s": timeout, "fields": fields})
        excluded: set[str] = set()
        for attempt in range(_RULE_TRIES):
            if attempt:  # a rule changed under us: read the version afresh
                version = self.store.redis.get(self.store.keys.rules.version)
            verdicts = self._verdicts(built, calls, excluded, version)
            result = self._run_create(run_id, round_no, built, items, verdicts, created_by)
            if result[0] != "rule_changed":
                break
            excluded.add(str(result[1]))  # revoked or expired meanwhile: match again without it
        else:
            raise RuntimeError(f"create kept finding its rules changed: {result!r}")
        if result[0] == "duplicate":
            raise InvalidInput(f"request {result[1]} already exists", code="duplicate")
        if result[0] != "ok":
            return str(result[0]), []
        if verdicts:  # decided at create: read back what the step wrote
            return "ok", self.get_requests(rid for rid, _ in built)
        # the requests as just written, without reading them back
        requests = [
            parse_request(
                {**item["fields"], "id": item["id"], "created_at": result[1], "expires_at": expires}
            )
            for item, expires in zip(items, result[2:], strict=True)
        ]
        return "ok", requests

    def _verdicts(
        self,
        built: list[tuple[str, NewRequest]],
        calls: dict[str, Call],
        excluded: set[str],
        version: bytes | None,
    ) -> dict[str, RuleVerdict]:
        """The rule deciding each approval call, if one does."""
        out: dict[str, RuleVerdict] = {}
        for rid, new in built:
            call = calls.get(rid)
            if call is None:
                continue
            found = self.rules.match(
                call, exclude=excluded, quorum=quorum_of(new, self.store.config), version=version
            )
            if found is not None:
                out[rid] = verdict_for(found[1])
        return out

    def _run_create(
        self,
        run_id: str | None,
        round_no: int,
        built: list[tuple[str, NewRequest]],
        items: list[dict[str, Any]],
        verdicts: dict[str, RuleVerdict],
        created_by: str | None,
    ) -> list[Any]:
        keys = self.store.keys.create_keys(
            run_id,
            round_no,
            [rid for rid, _ in built],
            {new.queue for _, new in built},
            {rid: v.rule_id for rid, v in verdicts.items()},
        )
        self.store.keys.creator_keys(keys, created_by)
        requests = [
            {**item, "rule": verdicts[item["id"]].lua()} if item["id"] in verdicts else item
            for item in items
        ]
        return self.store.scripts.run(
            "create",
            keys,
            maxlen=self.store.maxlen,
            round=str(round_no),
            retention=self.store.retention,
            requests=requests,
            **({"run_id": run_id} if run_id else {}),
        )

    def _agent_and_version(self, run_id: str | None) -> tuple[str | None, bytes | None]:
        """The agent the run runs (rules may be scoped to it) and the rules' version, in one
        round trip."""
        keys = self.store.keys
        if not run_id:
            return None, self.store.redis.get(keys.rules.version)
        pipe = self.store.redis.pipeline(transaction=False)
        pipe.hget(keys.run(run_id), "agent")
        pipe.get(keys.rules.version)
        agent, version = pipe.execute()
        return (as_str(agent) if agent else None), version

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
