"""A local SMTP server (aiosmtpd) that keeps every mail it is given, optionally requiring login."""

from __future__ import annotations

import email
import email.policy
import threading
from dataclasses import dataclass
from email.message import EmailMessage
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

from broker.redis.embedded import free_port


@dataclass(frozen=True)
class Mail:
    mail_from: str
    rcpt_tos: list[str]
    message: EmailMessage

    def part(self, subtype: str) -> str:
        """The text of the text/plain or text/html part."""
        body = self.message.get_body(preferencelist=(subtype,))
        assert body is not None, f"no text/{subtype} part"
        return str(body.get_content())  # type: ignore[attr-defined]


class _Sink:
    def __init__(self, owner: SmtpSink) -> None:
        self.owner = owner

    async def handle_RCPT(
        self, server: Any, session: Any, envelope: Any, address: str, options: list[str]
    ) -> str:
        if address in self.owner.refuse:
            return "550 no such user here"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        message = email.message_from_bytes(envelope.content, policy=email.policy.default)
        with self.owner.lock:
            self.owner.mails.append(
                Mail(envelope.mail_from, list(envelope.rcpt_tos), message)  # type: ignore[arg-type]
            )
        return "250 Message accepted"


class SmtpSink:
    def __init__(self, *, username: str | None = None, password: str | None = None) -> None:
        self.mails: list[Mail] = []
        self.logins: list[str] = []
        self.refuse: set[str] = set()
        self.lock = threading.Lock()
        self.port = free_port()
        kwargs: dict[str, Any] = {}
        if username is not None:
            kwargs = {
                "authenticator": self._authenticator(username, password or ""),
                "auth_required": True,
                "auth_require_tls": False,
            }
        self.controller = Controller(_Sink(self), hostname="127.0.0.1", port=self.port, **kwargs)

    def _authenticator(self, username: str, password: str) -> Any:
        def check(
            server: Any, session: Any, envelope: Any, mechanism: str, data: Any
        ) -> AuthResult:
            ok = (
                isinstance(data, LoginPassword)
                and data.login.decode() == username
                and data.password.decode() == password
            )
            if ok:
                self.logins.append(username)
            return AuthResult(success=ok)

        return check

    @property
    def url(self) -> str:
        return f"smtp://127.0.0.1:{self.port}"

    def start(self) -> SmtpSink:
        self.controller.start()
        return self

    def stop(self) -> None:
        self.controller.stop()

    def to(self, address: str) -> list[Mail]:
        with self.lock:
            return [m for m in self.mails if address in m.rcpt_tos]
