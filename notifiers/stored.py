"""A request as the router loaded it: the fields routing needs, the values of its JSON, and the
`Request` model only once a channel asks for one.

Webhooks need only the JSON (`broker.store.request_json`), routing only `callback`; Slack and email
want the model, parsed on first use. A hash outside the shapes `broker.store.request_json` knows is
parsed at once (`parse_request`), so a malformed request still fails where it did: in the
router's fetch, which dead-letters its entry.
"""

from __future__ import annotations

from broker.domain.models import Request
from broker.store.request_hash import parse_request
from broker.store.request_json import Values, request_json, request_values


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
