"""The inbox's contract kit: the inbox posts nothing anywhere; its page lists what an approver
may decide and follows `GET /v1/events`, re-rendering a request on each of its events. So the
kit follows that stream as alice does (the API under a real uvicorn server in a thread, as
SSE needs), and a request "posted" to the inbox is its `approval.requested` there; each later
event is heard there too, an ack included. People decide with their bearer token over REST
(`POST /v1/requests/{id}/decision`), as the page does.

Forged: a bearer token nobody has. A stranger: carol, whose token only asks (role `requester`).
No stale reply: see `no_stale`."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
from httpx import Response

from api.app import create_app
from api.testing import ServerThread
from broker.domain.settings import Settings
from tests.support.auth import bearer
from tests.support.channel_kit import (
    ACK,
    ALICE,
    DECISION,
    ESCALATION,
    FORGED,
    REQUESTER_TOKEN,
    STRANGER,
    TIMEOUT,
    TOKENS,
    VOTE,
    ChannelKit,
    Reply,
    World,
)
from tests.support.sse import events_of

NOBODYS_TOKEN = "tok-that-no-approver-has-01234567"


class Kit(ChannelKit):
    kind = "inbox"
    channels = ("inbox",)
    hears = {
        VOTE: "approval.voted",
        ACK: "approval.acked",
        DECISION: "approval.decided",
        ESCALATION: "approval.escalated",
        TIMEOUT: "approval.timed_out",
    }
    no_stale = (
        "a person decides in the inbox with their bearer token over REST: nothing in the reply"
        " ages or is spent (a repeat is the same person's decision, recorded once)"
    )

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        self.server: ServerThread | None = None
        self.reader: threading.Thread | None = None

    @contextmanager
    def running(self) -> Iterator[None]:
        try:
            yield
        finally:
            if self.server is not None:
                self.server.stop()  # ends the open event streams
            if self.reader is not None:
                self.reader.join(timeout=10)

    def started(self, world: World) -> None:
        app = create_app(Settings(), world.broker.config, world.broker)
        self.server = ServerThread(app).start()
        connected = threading.Event()
        self.reader = threading.Thread(
            target=self.follow, args=(self.server.url, connected), daemon=True
        )
        self.reader.start()
        assert connected.wait(10), "the event stream did not open"

    def follow(self, url: str, connected: threading.Event) -> None:
        """Alice's event stream, as her inbox page follows it, until the server stops."""
        timeout = httpx.Timeout(10.0, read=None)
        try:
            with (
                httpx.Client(base_url=url, timeout=timeout) as http,
                http.stream("GET", "/v1/events", headers=bearer(TOKENS[ALICE])) as stream,
            ):
                for item in events_of(stream.iter_lines()):
                    if item.comment == "connected":
                        connected.set()
                    if item.event and isinstance(item.data, dict):
                        with self.lock:
                            self.events.append((item.event, str(item.data.get("id"))))
        except httpx.HTTPError:
            pass  # the server went away at the end of the test

    def sections(self) -> dict[str, Any]:
        return {}

    def places(self) -> list[str]:
        return [ALICE]

    def heard(self, request_id: str) -> list[str]:
        with self.lock:
            return [event for event, about in self.events if about == request_id]

    def posts(self, request_id: str) -> list[str]:
        return [ALICE for event in self.heard(request_id) if event == "approval.requested"]

    def reply(self, world: World, request_id: str, person: str, how: str) -> Reply:
        token = {STRANGER: REQUESTER_TOKEN}.get(person, TOKENS.get(person, ""))
        if how == FORGED:
            token = NOBODYS_TOKEN
        headers = {**bearer(token), "Content-Type": "application/json"}
        body = json.dumps({"outcome": "approved"}).encode()
        return Reply(f"/v1/requests/{request_id}/decision", body, headers)

    def accepted(self, response: Response) -> bool:
        return response.status_code == 200 and response.json()["status"] == "approved"

    def refused(self, response: Response, how: str, person: str) -> bool:
        if how == FORGED:
            return response.status_code == 401 and response.json()["error"] == "unauthorized"
        # carol may not even see a request she did not ask for: 404, as for one that isn't
        return response.status_code == 404 and response.json()["error"] == "not_found"
