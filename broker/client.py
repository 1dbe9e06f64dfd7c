"""The client API that apps, agent workers, notifiers and the HTTP API call.

Every state change is one Lua script (see `broker/scripts/`), so a change either happens whole
or not at all, and concurrent callers can't both win.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic_core import to_json
from redis import Redis
from redis.backoff import ExponentialBackoff
from redis.exceptions import BusyLoadingError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from broker.config import Config, Settings, load_config
from broker.errors import Conflict, InvalidInput, NotFound
from broker.keys import RESUMER_GROUP, Keys
from broker.models import (
    Decision,
    HistoryEntry,
    NewRequest,
    Outcome,
    Request,
    Run,
    RunStatus,
    Status,
    canonical_json,
    from_timestamp,
    utcnow,
)
from broker.scripts import Scripts

_OUTCOME_STATUS = {
    Outcome.approved: Status.approved,
    Outcome.modified: Status.modified,
    Outcome.rejected: Status.rejected,
    Outcome.answered: Status.answered,
}
_JSON_FIELDS = ("args", "data", "metadata", "allowed_roles", "decision", "history")
_FIELDS = (
    "id", "run_id", "round", "tool_call_id", "tool_name", "args", "args_hash", "kind", "prompt", "data",
    "metadata", "queue", "allowed_roles", "callback", "created_at", "expires_at", "status", "history",
)  # fmt: skip
_TIMED_OUT_REASON = "No one answered within %s seconds."


def new_id(prefix: str) -> str:
    """A sortable, unguessable id: milliseconds since the epoch in hex, then 64 random bits."""
    return f"{prefix}_{int(time.time() * 1000):011x}{secrets.token_hex(8)}"


def _dec(value: bytes | str | None) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


Once = tuple[str, int]
"""A one-time marker: its Redis key (see `Keys.seen`) and how long it is kept, in seconds."""


@dataclass(frozen=True)
class SweepResult:
    """What the sweeper did to one due request."""

    request_id: str
    action: str  # "escalated" | "timed_out"
    from_queue: str
    to_queue: str | None


class Broker:
    """Durable approval requests and runs on one Redis.

    `redis` must be a client *without* `decode_responses`; the broker decodes what it reads.
    """

    def __init__(self, redis: Redis, config: Config | None = None, *, prefix: str = "ab:") -> None:
        self.redis = redis
        self.config = config or load_config(None)
        self.keys = Keys(prefix)
        self.scripts = Scripts(redis)
        self.maxlen = self.config.broker.stream_maxlen
        self.retention = int(self.config.broker.retention_s)

    @classmethod
    def from_settings(
        cls,
        settings: Settings | None = None,
        config: Config | None = None,
        *,
        patient: bool = False,
    ) -> Broker:
        """Connect as the environment says (APPROVAL_BROKER_REDIS_URL must be set).

        A `patient` broker (the background roles) rides out a Redis restart: each command is
        retried with back-off for about half a minute while Redis is unreachable or loading.
        """
        settings = settings or Settings()
        if not settings.redis_url:
            raise InvalidInput("APPROVAL_BROKER_REDIS_URL is not set", code="no_redis")
        config = config or load_config(settings.config)
        return cls(connect(settings.redis_url, patient=patient), config, prefix=settings.key_prefix)

    # ---- requests -------------------------------------------------------------------------

    def _check_queue(self, queue: str) -> None:
        if queue not in self.config.queues:
            known = ", ".join(sorted(self.config.queues))
            raise InvalidInput(
                f"queue {queue!r} is not defined (known: {known})", code="unknown_queue"
            )

    def _build(
        self, new: NewRequest, now: float, run_id: str | None, round_no: int, rid: str
    ) -> tuple[Request, dict[str, str]]:
        self._check_queue(new.queue)
        if new.callback is not None and new.callback not in self.config.webhooks:
            raise InvalidInput(
                f"callback webhook {new.callback!r} is not defined", code="unknown_webhook"
            )
        timeout = new.timeout_s if new.timeout_s is not None else self.config.timeout_for(new.queue)
        expires = now + timeout
        canonical = canonical_json(new.args)
        request = Request(
            id=rid,
            run_id=run_id,
            round=round_no,
            tool_call_id=new.tool_call_id or rid,
            tool_name=new.tool_name,
            args=new.args,
            args_hash=hashlib.sha256(canonical.encode()).hexdigest(),
            kind=new.kind,
            prompt=new.prompt or default_prompt(new.tool_name, new.args),
            data=new.data,
            metadata=new.metadata,
            queue=new.queue,
            allowed_roles=new.allowed_roles,
            callback=new.callback,
            created_at=from_timestamp(now),
            expires_at=from_timestamp(expires),
        )
        fields = {
            "id": rid,
            "run_id": run_id or "",
            "round": str(round_no),
            "tool_call_id": request.tool_call_id,
            "tool_name": request.tool_name,
            "args": canonical,
            "args_hash": request.args_hash,
            "kind": request.kind,
            "prompt": request.prompt,
            "data": _json(request.data),
            "metadata": _json(request.metadata),
            "queue": request.queue,
            "allowed_roles": _json(request.allowed_roles),
            "callback": request.callback or "",
            "created_at": f"{now:.6f}",
            "expires_at": f"{expires:.6f}",
            "status": Status.pending.value,
            "history": "[]",
        }
        return request, fields

    def create_request(self, new: NewRequest) -> Request:
        """Create a standalone request (no run): stored, indexed for expiry, and announced."""
        now = time.time()
        request, fields = self._build(new, now, None, 0, new_id("req"))
        self._create(now, "", 0, [(request, fields)])
        return request

    def create_requests(self, news: Sequence[NewRequest]) -> list[Request]:
        """Create many standalone requests in one atomic step (bulk import, load tests)."""
        now = time.time()
        built = [self._build(new, now, None, 0, new_id("req")) for new in news]
        if built:
            self._create(now, "", 0, built)
        return [request for request, _ in built]

    def create_round(
        self, run_id: str, round_no: int, calls: Sequence[NewRequest]
    ) -> list[Request]:
        """Register every pending call of one round of a run at once.

        Idempotent per (run, round): a retried job that registers the same round again gets the
        requests already stored, and nothing is announced twice.
        """
        if not calls:
            raise InvalidInput("a round needs at least one pending call")
        now = time.time()
        built = [
            self._build(call, now, run_id, round_no, f"{run_id}.{round_no}.{i}")
            for i, call in enumerate(calls)
        ]
        if self._create(now, run_id, round_no, built) == "exists":
            return self.round_requests(run_id, round_no)
        return [request for request, _ in built]

    def _create(
        self, now: float, run_id: str, round_no: int, built: list[tuple[Request, dict[str, str]]]
    ) -> str:
        argv: list[Any] = [self.keys.prefix, f"{now:.6f}", self.maxlen, run_id, round_no, *_FIELDS]
        for _, fields in built:
            argv.append(json.dumps([fields[name] for name in _FIELDS], ensure_ascii=False))
        result = [_dec(x) for x in self.scripts.create(args=argv)]
        if result[0] == "duplicate":
            raise InvalidInput(f"request {result[1]} already exists", code="duplicate")
        return str(result[0])

    def get_request(self, request_id: str) -> Request:
        raw = self.redis.hgetall(self.keys.request(request_id))
        if not raw:
            raise NotFound(f"no request with id {request_id!r}")
        return _parse_request(raw)

    def get_requests(self, ids: Iterable[str]) -> list[Request]:
        ids = list(ids)
        pipe = self.redis.pipeline(transaction=False)
        for rid in ids:
            pipe.hgetall(self.keys.request(rid))
        return [_parse_request(raw) for raw in pipe.execute() if raw]

    def list_requests(
        self, *, status: Status | str | None = None, queue: str | None = None, limit: int = 100
    ) -> list[Request]:
        """Pending ones soonest to expire first (from the expiry index); otherwise the most
        recently created or decided first."""
        status = Status(status) if status else None
        source = self.keys.expiry if status is Status.pending else self.keys.requests
        out: list[Request] = []
        start, page = 0, max(limit, 100)
        while len(out) < limit:
            if source == self.keys.expiry:
                ids = self.redis.zrange(source, start, start + page - 1)
            else:
                ids = self.redis.zrevrange(source, start, start + page - 1)
            if not ids:
                break
            for request in self.get_requests(_dec(i) for i in ids):
                if (status is None or request.status is status) and (
                    queue is None or request.queue == queue
                ):
                    out.append(request)
            start += page
        return out[:limit]

    def round_requests(self, run_id: str, round_no: int) -> list[Request]:
        ids = [_dec(i) for i in self.redis.lrange(self.keys.run_round(run_id, round_no), 0, -1)]
        return self.get_requests(ids)

    def add_history(self, request_id: str, entry: HistoryEntry) -> None:
        """Append to a request's history (deliveries, for example) in one atomic step."""
        self.scripts.note(args=[self.keys.prefix, request_id, _history_json(entry)])

    # ---- deciding -------------------------------------------------------------------------

    def decide(
        self,
        request_id: str,
        decision: Decision,
        *,
        decided_by: str,
        in_queue: str | None = None,
        once: Once | None = None,
    ) -> Request:
        """Record a decision; the first one wins.

        Raises `Conflict` (carrying the request as it stands) when it was already decided or timed
        out, `InvalidInput` for a decision that can never apply, `NotFound` for an unknown id.
        With `in_queue`, the decision only applies while the request waits in that queue (a
        link mailed to one queue's people); otherwise `Conflict` with code `escalated`.
        With `once` (a marker key and its lifetime: a webhook-id, an email link), the marker is
        checked and spent in the same atomic step; a spent one is `Conflict` code `replayed`.
        """
        if decision.outcome is Outcome.escalated:
            return self.escalate(
                request_id,
                decision.target,
                reason=decision.reason,
                by=decided_by,
                args_hash=decision.args_hash,
                once=once,
            )
        if decision.outcome not in _OUTCOME_STATUS:
            raise InvalidInput(f"outcome {decision.outcome.value!r} can't be given as a decision")
        recorded = decision.model_copy(update={"decided_by": decided_by, "decided_at": utcnow()})
        result = [
            _dec(x)
            for x in self.scripts.decide(
                args=[
                    self.keys.prefix,
                    request_id,
                    decision.outcome.value,
                    _OUTCOME_STATUS[decision.outcome].value,
                    json.dumps(recorded.public(), separators=(",", ":")),
                    decision.args_hash or "",
                    f"{time.time():.6f}",
                    self.maxlen,
                    self.retention,
                    in_queue or "",
                    *(once or ("", 0)),
                ]
            )
        ]
        self._raise_for(result, request_id, decision)
        return self.get_request(request_id)

    def escalate(
        self,
        request_id: str,
        target: str | None = None,
        *,
        reason: str | None = None,
        by: str,
        args_hash: str | None = None,
        once: Once | None = None,
    ) -> Request:
        """Move a pending request to another handler queue (default: its queue's `escalate_to`).

        `once` works as for `decide`.
        """
        if target is None:
            current = self.get_request(request_id)
            if not current.is_pending:
                raise Conflict(
                    f"request {request_id} is already {current.status.value}", request=current
                )
            target = self.config.escalation_target(current.queue)
            if target is None:
                raise InvalidInput(
                    f"queue {current.queue!r} has no escalate_to; name a target queue",
                    code="no_target",
                )
        self._check_queue(target)
        now = time.time()
        entry = HistoryEntry(
            at=from_timestamp(now), event="escalated", by=by, to_queue=target, reason=reason
        )
        result = [
            _dec(x)
            for x in self.scripts.escalate(
                args=[
                    self.keys.prefix,
                    request_id,
                    target,
                    f"{now + self.config.timeout_for(target):.6f}",
                    _history_json(entry),
                    args_hash or "",
                    self.maxlen,
                    *(once or ("", 0)),
                ]
            )
        ]
        if result[0] == "same_queue":
            raise InvalidInput(
                f"request {request_id} is already in queue {target!r}", code="same_queue"
            )
        self._raise_for(result, request_id, None)
        return self.get_request(request_id)

    def _raise_for(
        self, result: list[str | None], request_id: str, decision: Decision | None
    ) -> None:
        code = result[0]
        if code == "ok":
            return
        if code == "not_found":
            raise NotFound(f"no request with id {request_id!r}")
        conflicts = {
            "conflict": ("conflict", "request {id} is already {status}"),
            "replayed": ("replayed", "this reply was already received; request {id} is {status}"),
            "moved": ("escalated", "request {id} was escalated to {queue}"),
        }
        if code in conflicts:
            current = self.get_request(request_id)
            conflict_code, message = conflicts[code]
            detail = message.format(id=request_id, status=current.status.value, queue=current.queue)
            raise Conflict(detail, request=current, code=conflict_code)
        if code == "stale_args":
            raise InvalidInput(
                f"args_hash does not match request {request_id}'s args: the decision was made on other args",
                code="stale_args",
            )
        if code == "wrong_kind":
            outcome = decision.outcome.value if decision else "?"
            raise InvalidInput(
                f"outcome {outcome!r} does not apply to a request of kind {result[1]!r}",
                code="wrong_kind",
            )
        raise RuntimeError(f"unexpected script result {result!r}")

    def sweep(self, *, now: float | None = None, limit: int = 200) -> list[SweepResult]:
        """Escalate or time out up to `limit` due requests in one atomic step."""
        now = time.time() if now is None else now
        routes = {
            name: {"to": q.escalate_to or False, "timeout": q.timeout_s}
            for name, q in self.config.queues.items()
        }
        now_iso = from_timestamp(now).isoformat()
        template = json.dumps(
            {
                "outcome": "timed_out",
                "reason": _TIMED_OUT_REASON,
                "decided_by": "sweeper",
                "decided_at": now_iso,
            }
        )
        flat = [
            _dec(x)
            for x in self.scripts.sweep(
                args=[
                    self.keys.prefix,
                    f"{now:.6f}",
                    now_iso,
                    limit,
                    json.dumps(routes),
                    self.maxlen,
                    template,
                    self.retention,
                ]
            )
        ]
        return [
            SweepResult(flat[i], flat[i + 1], flat[i + 2], flat[i + 3] or None)  # type: ignore[arg-type]
            for i in range(0, len(flat), 4)
        ]

    # ---- runs ----------------------------------------------------------------------------

    def create_run(
        self,
        agent: str,
        prompt: str,
        *,
        run_id: str | None = None,
        extra: dict[str, str] | None = None,
    ) -> Run:
        """Store a new `queued` run (without enqueueing it: see `broker.runs.start_run`)."""
        fields = self.new_run_fields(agent, prompt, run_id=run_id, extra=extra)
        self.redis.hset(self.keys.run(fields["id"]), mapping=fields)
        return self.get_run(fields["id"])

    def new_run_fields(
        self,
        agent: str,
        prompt: str,
        *,
        run_id: str | None = None,
        extra: dict[str, str] | None = None,
    ) -> dict[str, str]:
        """The hash of a new `queued` run, for callers that store it in a transaction."""
        now = f"{time.time():.6f}"
        return {
            "id": run_id or new_id("run"),
            "agent": agent,
            "prompt": prompt,
            "status": RunStatus.queued.value,
            "round": "0",
            "created_at": now,
            "updated_at": now,
            **(extra or {}),
        }

    def counts(self) -> dict[str, int]:
        """Fleet-wide request counts kept by the Lua steps: `pending:QUEUE` (now waiting) and
        `STATUS:QUEUE` (outcomes so far)."""
        raw = self.redis.hgetall(self.keys.counts)
        return {_dec(k): int(v) for k, v in raw.items()}  # type: ignore[misc]

    def run_fields(self, run_id: str) -> dict[str, str]:
        raw = self.redis.hgetall(self.keys.run(run_id))
        if not raw:
            raise NotFound(f"no run with id {run_id!r}")
        return {_dec(k): _dec(v) for k, v in raw.items()}  # type: ignore[misc]

    def get_run(self, run_id: str) -> Run:
        f = self.run_fields(run_id)
        pending = sorted(_dec(x) for x in self.redis.smembers(self.keys.run_pending(run_id)))
        return Run(
            id=f["id"],
            agent=f["agent"],
            status=RunStatus(f["status"]),
            round=int(f.get("round", 0)),
            pending=pending,  # type: ignore[arg-type]
            output=json.loads(f["output"]) if f.get("output") else None,
            error=f.get("error") or None,
            created_at=from_timestamp(float(f["created_at"])),
            updated_at=from_timestamp(float(f["updated_at"])),
        )

    def update_run(self, run_id: str, **fields: Any) -> None:
        """Set run fields (status, output as JSON, error, ...) and touch `updated_at`.

        A run that ends (finished or failed) is kept `retention_s`, like a decided request.
        """
        mapping = {k: (v.value if isinstance(v, RunStatus) else v) for k, v in fields.items()}
        mapping["updated_at"] = f"{time.time():.6f}"
        pipe = self.redis.pipeline()
        pipe.hset(self.keys.run(run_id), mapping=mapping)
        if mapping.get("status") in (RunStatus.finished.value, RunStatus.failed.value):
            self.expire_run(pipe, run_id)
        pipe.execute()

    def expire_run(self, pipe: Any, run_id: str) -> None:
        """Queue on `pipe` the expiry of every key of an ended run (after `retention_s`)."""
        rounds = int(self.redis.hget(self.keys.run(run_id), "round") or 0)
        keys = [
            self.keys.run(run_id),
            self.keys.run_pending(run_id),
            self.keys.run_messages(run_id),
        ]
        keys += [self.keys.run_round(run_id, n) for n in range(rounds + 1)]
        for key in keys:
            pipe.expire(key, self.retention)

    def save_messages(self, run_id: str, messages_json: bytes) -> None:
        self.redis.set(self.keys.run_messages(run_id), messages_json)

    def load_messages(self, run_id: str) -> bytes | None:
        return self.redis.get(self.keys.run_messages(run_id))

    # ---- the resume outbox -----------------------------------------------------------------

    def ensure_group(self, stream: str, group: str) -> None:
        try:
            self.redis.xgroup_create(stream, group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def ack_resume(self, entry_id: str) -> None:
        """Acknowledge an outbox entry and drop it: once its job is enqueued it is history.

        Dropping only acknowledged entries keeps the outbox small without ever trimming an
        entry a resumer still holds.
        """
        pipe = self.redis.pipeline()
        pipe.xack(self.keys.resumes, RESUMER_GROUP, entry_id)
        pipe.xdel(self.keys.resumes, entry_id)
        pipe.execute()

    # ---- dead letters -------------------------------------------------------------------

    def dead_letter(
        self,
        source: str,
        error: str,
        *,
        stream: str | None = None,
        entry: dict[str, str] | None = None,
        extra: dict[str, str] | None = None,
    ) -> str:
        """Record something that could not be handled, with its cause.

        `stream` and `entry` name the stream entry it came from, so `redrive` can put it back.
        """
        fields = {
            "source": source,
            "error": error[:2000],
            "at": utcnow().isoformat(),
            **(extra or {}),
        }
        if stream:
            fields["stream"] = stream
        for k, v in (entry or {}).items():
            fields[f"f.{k}"] = v
        return _dec(
            self.redis.xadd(self.keys.dead_letters, fields, maxlen=self.maxlen, approximate=True)
        )  # type: ignore[return-value]

    def redrive(self, entry_id: str) -> bool:
        """Put a dead letter that came from a stream back on that stream, and drop the letter."""
        rows = self.redis.xrange(self.keys.dead_letters, entry_id, entry_id)
        if not rows:
            raise NotFound(f"no dead letter {entry_id!r}")
        fields = {_dec(k): _dec(v) for k, v in rows[0][1].items()}
        stream = fields.pop("stream", None)
        if not stream:
            raise InvalidInput(
                f"dead letter {entry_id} did not come from a stream; it can't be re-driven"
            )
        original = {k.removeprefix("f."): v for k, v in fields.items() if k.startswith("f.")}
        pipe = self.redis.pipeline()
        pipe.xadd(stream, original)  # type: ignore[arg-type]
        pipe.xdel(self.keys.dead_letters, entry_id)
        pipe.execute()
        return True

    def dead_letters(self, count: int = 100) -> list[tuple[str, dict[str, str]]]:
        rows = self.redis.xrange(self.keys.dead_letters, count=count)
        return [(_dec(eid), {_dec(k): _dec(v) for k, v in f.items()}) for eid, f in rows]  # type: ignore[misc]


def connect(url: str, *, patient: bool = False) -> Redis:
    """A Redis client for `url`; see `Broker.from_settings` for `patient`."""
    if not patient:
        return Redis.from_url(url)
    return Redis.from_url(
        url,
        retry=Retry(ExponentialBackoff(cap=2.0, base=0.05), 25),
        retry_on_error=[BusyLoadingError, RedisConnectionError, RedisTimeoutError],
    )


def _json(value: Any) -> str:
    return to_json(value).decode()


def default_prompt(tool_name: str, args: dict[str, Any]) -> str:
    """A readable sentence from a tool call: `refund(order_id='A1', amount=120)`."""
    shown = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in args.items())
    return f"The agent wants to call {tool_name}({shown})"


def _history_json(entry: HistoryEntry) -> str:
    return entry.model_dump_json(exclude_none=True)


def _parse_request(raw: dict[bytes, bytes]) -> Request:
    f: dict[str, Any] = {_dec(k): _dec(v) for k, v in raw.items()}  # type: ignore[misc]
    for name in _JSON_FIELDS:
        if f.get(name):
            f[name] = json.loads(f[name])
        else:
            f.pop(name, None)
    f["run_id"] = f.get("run_id") or None
    f["callback"] = f.get("callback") or None
    f["created_at"] = from_timestamp(float(f["created_at"]))
    f["expires_at"] = from_timestamp(float(f["expires_at"]))
    return Request.model_validate(f)
