"""Email's contract kit: a local SMTP server (aiosmtpd, tests/support/fakes/smtp.py) the
notifier mails each list member at, and the decision links in those mails, POSTed to
`/v1/email/{token}` as the confirm page does.

Mail asks for a decision: one mail per member when a request arrives, and nothing on any
later event (the links in it stop working instead). carol is on the list but no approver, so
her mail has no links: her link, signed by the broker as for anyone (`sign_link`), is the
stranger's reply. Forged: a link whose token was altered. Stale: a link already used (the
nonce of alice's mail, spent with her vote)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

from httpx import Response

from channels.email.links import new_nonce, sign_link
from tests.support.channel_kit import ALICE, BOB, FORGED, STALE, STRANGER, ChannelKit, Reply, World
from tests.support.fakes.smtp import SmtpSink

ADDRESSES = {ALICE: "alice@example.com", BOB: "bob@example.com", STRANGER: "carol@example.com"}
APPROVE = re.compile(r"^Approve:\s*\n(\S+)", re.MULTILINE)


class Kit(ChannelKit):
    kind = "email"
    channels = ("email:leads",)

    def __init__(self) -> None:
        self.smtp = SmtpSink()

    @contextmanager
    def running(self) -> Iterator[None]:
        self.smtp.start()
        try:
            yield
        finally:
            self.smtp.stop()

    def sections(self) -> dict[str, Any]:
        return {
            "email": {
                "smtp_url": self.smtp.url,
                "from": "approvals@example.com",
                "public_url": "http://testserver",  # the links lead to the in-process API
                "lists": {"leads": {"to": sorted(ADDRESSES.values())}},
            }
        }

    def identity(self, person: str) -> dict[str, Any]:
        return {"email": ADDRESSES[person]}

    def places(self) -> list[str]:
        return sorted(ADDRESSES.values())

    def mails(self, request_id: str) -> list[Any]:
        with self.smtp.lock:
            return [m for m in self.smtp.mails if m.message["X-Approval-Request"] == request_id]

    def posts(self, request_id: str) -> list[str]:
        return [to for mail in self.mails(request_id) for to in mail.rcpt_tos]

    def approve_link(self, request_id: str, person: str) -> str:
        """The path of the Approve link in `person`'s mail about the request."""
        address = ADDRESSES[person]
        [mail] = [m for m in self.mails(request_id) if address in m.rcpt_tos]
        [url] = APPROVE.findall(mail.part("plain"))
        return urlsplit(url).path

    def reply(self, world: World, request_id: str, person: str, how: str) -> Reply:
        if person == STRANGER:
            request = world.broker.get_request(request_id)
            token = sign_link(
                world.broker,
                request_id,
                ADDRESSES[STRANGER],
                "approve",
                new_nonce(),
                queue=request.queue,
                escalations=request.escalations,
            )
            return Reply(f"/v1/email/{token}")
        if how == STALE:
            used = Reply(self.approve_link(request_id, ALICE))
            assert world.send(used).status_code == 200
            return used
        path = self.approve_link(request_id, person)
        if how == FORGED:
            path = path[:-4] + ("AAAA" if not path.endswith("AAAA") else "BBBB")
        return Reply(path)

    def accepted(self, response: Response) -> bool:
        return response.status_code == 200 and response.headers["content-type"].startswith(
            "text/html"
        )

    def refused(self, response: Response, how: str, person: str) -> bool:
        status, error = {FORGED: (403, "link_invalid"), STALE: (410, "link_used")}.get(
            how, (403, "forbidden")
        )
        return response.status_code == status and f'data-error="{error}"' in response.text
