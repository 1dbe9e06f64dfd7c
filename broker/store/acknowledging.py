"""Acknowledging a request ("I'm on it"): it stays pending and the sweeper holds off for a while.

One Lua step (ack.lua) checks the request is still pending (and still in the queue the caller
saw), records who and when in its history, and pushes its expiry entry to at least now + the
queue's `ack_timeout_s`; the sweep honours the hold as well. It announces `approval.acked` on
the queue's stream (Slack updates the message, SSE listeners hear). An ack never changes the
outcome and never counts as a vote. Who may acknowledge is the judge's call (`broker.judge`).
"""

from __future__ import annotations

from broker.domain.errors import Conflict, NotFound
from broker.domain.models import Request
from broker.store.handles import Store
from broker.store.request_hash import parse_flat


class Acks:
    def __init__(self, store: Store) -> None:
        self.store = store

    def ack(self, request_id: str, *, acked_by: str, in_queue: str, channel: str = "") -> Request:
        """Hold escalation of a request pending in `in_queue` for that queue's `ack_timeout_s`,
        recording `acked_by` (who is on it) and the channel they said so through.

        Raises `NotFound`, or `Conflict` (with the request) when it is no longer pending
        (code `conflict`) or has moved to another queue meanwhile (code `escalated`).
        """
        store = self.store
        keys = store.keys.ack_keys(request_id).stream(
            in_queue, store.keys.of_request(request_id).stream(in_queue)
        )
        result = store.scripts.run(
            "ack",
            keys,
            maxlen=store.maxlen,
            id=request_id,
            by=acked_by,
            channel=channel,
            hold_s=store.config.ack_timeout_for(in_queue),
            in_queue=in_queue,
        )
        code, fields = result[0], result[2:]
        if code == "not_found":
            raise NotFound(f"no request with id {request_id!r}")
        request = parse_flat(fields)
        if code == "conflict":
            raise Conflict(
                f"request {request_id} is already {request.status.value}: there is nothing to"
                " be on",
                request=request,
            )
        if code == "moved":
            raise Conflict(
                f"request {request_id} was escalated to {request.queue}",
                request=request,
                code="escalated",
            )
        return request
