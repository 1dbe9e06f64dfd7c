"""The requests stream events point at, loaded for the notifier: the fields routing needs, the
values of its JSON, and the `Request` model only once a channel asks for one.

Webhooks need only the JSON (`broker.store.request_json`), routing only `callback`; Slack and
email want the model, parsed on first use. A hash outside the shapes `broker.store.request_json`
knows is parsed at once (`parse_request`), so a malformed request still fails where it did: in
the router's fetch, which dead-letters its entry.

Why a store service (`StoredRequests`): the notifier's router reads a batch of requests per
batch of entries, on its hot path; how (one pipeline of HGETALLs on a single Redis, without a
model per request; `Requests.get_requests` on a cluster) is the store's. It reads only (a
client's retry may send it again) and never raises for one bad request: it reports it, so the
router can dead-letter that entry and deliver the others.
"""

from __future__ import annotations

from redis import Redis
from redis.exceptions import RedisError

from broker.domain.models import Request
from broker.redis.replies import as_str_dict
from broker.store.handles import Store
from broker.store.request_hash import parse_request
from broker.store.request_json import Values, request_json, request_values
from broker.store.requests import Requests


class StoredRequest:
    """One loaded request; `request` and `data_json` may be called from any thread (at worst
    two threads parse it both, and one result is kept)."""

    __slots__ = ("id", "callback", "traceparent", "_fields", "_values", "_request")

    def __init__(
        self,
        request_id: str,
        callback: str | None,
        fields: dict[str, str] | None,
        values: Values | None,
        request: Request | None,
    ) -> None:
        self.id = request_id
        self.callback = callback
        self._fields = fields
        self._values = values
        self._request = request
        self.traceparent = fields.get("traceparent") if fields else None
        """The trace the request was made in (`broker.tracing.telemetry`), when tracing was on."""

    @classmethod
    def load(cls, fields: dict[str, str]) -> StoredRequest:
        """From a hash's fields (decoded); raises as `parse_request` does for a malformed one."""
        values = request_values(fields)
        if values is None:
            request = parse_request(fields)
            return cls(request.id, request.callback, fields, None, request)
        return cls(values["id"], values["callback"], fields, values, None)

    @classmethod
    def of(cls, request: Request) -> StoredRequest:
        return cls(request.id, request.callback, None, None, request)

    @property
    def request(self) -> Request:
        request = self._request
        if request is None:
            assert self._fields is not None
            request = self._request = parse_request(self._fields)
        return request

    def data_json(self) -> bytes:
        """`Request.model_dump_json()`, as bytes."""
        if self._values is not None:
            return request_json(self._values)
        return self.request.model_dump_json().encode()


class StoredRequests:
    """Loads the requests a batch of stream entries points at (see the module's docstring)."""

    def __init__(self, store: Store, requests: Requests) -> None:
        self.store = store
        self.requests = requests
        self._plain = isinstance(store.redis, Redis)  # one Redis: stored fields, no models

    def fetch(self, ids: set[str]) -> tuple[dict[str, StoredRequest], dict[str, str]]:
        """The requests of `ids` that exist, and a problem per request that won't load (one
        bad request is reported, not raised); Redis errors are raised."""
        try:
            if self._plain:
                return self._fetch_stored(ids), {}
            return {r.id: StoredRequest.of(r) for r in self.requests.get_requests(ids)}, {}
        except RedisError:
            raise
        except Exception:  # one bad request: load them one by one to find it
            found: dict[str, StoredRequest] = {}
            problems: dict[str, str] = {}
            for rid in ids:
                try:
                    found[rid] = StoredRequest.of(self.requests.get_request(rid))
                except RedisError:
                    raise
                except Exception as exc:
                    problems[rid] = f"{type(exc).__name__}: {str(exc)[:300]}"
            return found, problems

    def _fetch_stored(self, ids: set[str]) -> dict[str, StoredRequest]:
        """`Requests.get_requests` as one pipeline of HGETALLs, without a `Request` model unless
        the hash is an unusual one. Reads only: the client's retry policy may send it again."""
        key = self.store.keys.request
        pipe = self.store.redis.pipeline(transaction=False)
        for rid in ids:
            pipe.hgetall(key(rid))
        found: dict[str, StoredRequest] = {}
        for reply in pipe.execute():
            if reply:
                request = StoredRequest.load(as_str_dict(reply))
                found[request.id] = request
        return found
