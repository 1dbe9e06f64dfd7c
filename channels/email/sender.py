"""Email: one HTML + plain-text mail per recipient, with signed, single-use, expiring links.

Each mail gets its own nonce, so its links are bound to that recipient and spent together on
first use (see channels.email.links); they are bound to the queue the mail was sent for and to the
request's escalation count too. Only a recipient who may decide the request (the decision
service's own rule: roles, queue roles, lists that let unmapped addresses decide) gets
decision links; anyone else on the list gets the same mail without links, saying why. A
recipient whose mail went out is marked done in Redis, so a retry after a partial failure
mails only the ones still missing.
"""

from __future__ import annotations

import smtplib
import ssl
from dataclasses import dataclass
from datetime import timedelta
from email.message import EmailMessage
from email.utils import formatdate, make_msgid
from urllib.parse import unquote, urlsplit

from broker.domain.config import Config
from broker.domain.events import ESCALATED, REQUESTED, Event
from broker.domain.models import Request, utcnow
from broker.domain.persons import normal_address
from broker.facade import Broker, DeliveryState
from broker.judge import refusal
from broker.judge.rule_decisions import run_rule_index
from channels.email.config import EmailConfig
from channels.email.deciders import email_decider
from channels.email.links import new_nonce, sign_link
from channels.email.render import Link, render_mail
from channels.retry import GiveUp, Retry, RetryPolicy
from channels.sender import Delivery, Sender


@dataclass(frozen=True)
class SmtpTarget:
    host: str
    port: int
    implicit_tls: bool
    username: str | None = None
    password: str | None = None


def parse_smtp_url(url: str) -> SmtpTarget:
    """`smtp://host[:port]` (STARTTLS if configured) or `smtps://host[:port]` (TLS from the start)."""
    parts = urlsplit(url)
    if parts.scheme not in ("smtp", "smtps"):
        raise ValueError(f"smtp_url must start with smtp:// or smtps://, got {parts.scheme!r}")
    if not parts.hostname:
        raise ValueError("smtp_url names no host")
    try:
        port = parts.port
    except ValueError:
        raise ValueError("smtp_url has a bad port") from None
    implicit = parts.scheme == "smtps"
    return SmtpTarget(
        host=parts.hostname,
        port=port or (465 if implicit else 25),
        implicit_tls=implicit,
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password else None,
    )


PLAINTEXT_AUTH = (
    "email: username/password without TLS would send the password in clear; use smtps://,"
    " or starttls = true, or set allow_plaintext_auth = true in [email] to accept that"
)


def smtp_target(email: EmailConfig) -> SmtpTarget:
    """The mail server `[email]` names, checked; ValueError says which key to fix.

    Credentials go out only over TLS (smtps:// or STARTTLS), unless `allow_plaintext_auth`
    says a server without TLS (a local relay, a test sink) is meant.
    """
    try:
        target = parse_smtp_url(email.smtp_url)
    except ValueError as exc:
        raise ValueError(f"email.smtp_url: {exc}") from None
    credentials = bool(email.username or target.username)
    tls = target.implicit_tls or email.starttls
    if credentials and not tls and not email.allow_plaintext_auth:
        raise ValueError(PLAINTEXT_AUTH)
    return target


def link_actions(request: Request, config: Config) -> list[str]:
    """Approve only approvals; answer only questions and external calls; anything may be
    rejected; escalate where the request's queue names a next queue (as Slack's button)."""
    actions = ["approve", "reject"] if request.kind == "approval" else ["answer", "reject"]
    if run_rule_index(request) is not None:
        actions.insert(1, "approve_run")
    if config.escalation_target(request.queue):
        actions.append("escalate")
    return actions


class EmailSender(Sender):
    kind = "email"

    def __init__(
        self,
        name: str,
        recipients: list[str],
        *,
        email: EmailConfig,
        broker: Broker,
        config: Config,
        state: DeliveryState,
        policy: RetryPolicy,
        concurrency: int,
        timeout_s: float,
    ) -> None:
        super().__init__(name, policy=policy, concurrency=concurrency)
        # one mail per person: addresses that differ only in case are one mailbox, one vote
        first: dict[str, str] = {}
        for address in recipients:
            first.setdefault(normal_address(address), address)
        self.recipients = list(first.values())
        self.email = email
        self.broker = broker
        self.config = config
        self.state = state
        self.timeout_s = timeout_s
        self.target = smtp_target(email)

    def wants(self, event: Event) -> bool:
        """Mail asks for a decision: on a new request, and when one arrives by escalation."""
        return event.type == REQUESTED or (event.type == ESCALATED and not event.moved_away)

    def deliver(self, delivery: Delivery) -> str | None:
        event = delivery.event
        request = self.broker.get_request(event.request_id)
        if not request.is_pending or request.queue != event.queue:
            return None  # decided or moved on before we got here: nothing to ask anyone
        todo = [
            r
            for r in self.recipients
            if not self.state.is_done(request.id, event.done_field(self.name, r))
        ]
        if not todo:
            return None
        refused: list[str] = []
        smtp = self._connect()
        try:
            for recipient in todo:
                message = self.build(request, recipient)
                try:
                    smtp.send_message(message, from_addr=self.email.from_, to_addrs=[recipient])
                except smtplib.SMTPRecipientsRefused as exc:
                    codes = [code for code, _ in exc.recipients.values()]
                    if all(500 <= c < 600 for c in codes):
                        refused.append(f"{recipient} ({codes[0] if codes else '?'})")
                        continue
                    raise Retry(f"server refused {recipient} for now: {codes}") from None
                except smtplib.SMTPResponseException as exc:
                    raise _classify(exc) from None
                except (smtplib.SMTPException, OSError) as exc:
                    raise Retry(f"SMTP connection lost: {type(exc).__name__}: {exc}") from None
                self.state.mark_done(request.id, event.done_field(self.name, recipient))
        finally:
            _quit(smtp)
        if refused:
            raise GiveUp(f"the mail server refused {', '.join(refused)}")
        return f"{event.type}: mailed {len(todo)} recipient(s)"

    def refusal(self, request: Request, recipient: str) -> str | None:
        """Why `recipient` may not decide `request` (None: they may), by the judge's rule,
        the same one a link is checked against when it is used."""
        decider = email_decider(self.config, recipient)
        return refusal(request, decider.principal, decider.via, self.config)

    def build(self, request: Request, recipient: str) -> EmailMessage:
        """The mail for one recipient. Its links are bound to the queue it is sent for and to the
        request's escalation count: once the request moves on (escalated, even away and back),
        they no longer decide it. A recipient who may not decide gets no links."""
        refusal = self.refusal(request, recipient)
        links = [] if refusal else self._links(request, recipient)
        until = min(request.expires_at, utcnow() + timedelta(seconds=self.email.link_ttl_s))
        subject, text, html = render_mail(
            request, self.config, recipient, links, until, refusal=refusal
        )
        message = EmailMessage()
        message["Subject"] = subject
        message["From"] = self.email.from_
        message["To"] = recipient
        message["Date"] = formatdate(localtime=False)
        domain = self.email.from_.rpartition("@")[2] or None
        message["Message-ID"] = make_msgid(domain=domain)
        message["Auto-Submitted"] = "auto-generated"
        message["X-Approval-Request"] = request.id
        message.set_content(text)
        message.add_alternative(html, subtype="html")
        return message

    def _links(self, request: Request, recipient: str) -> list[Link]:
        nonce = new_nonce()
        base = self.email.public_url.rstrip("/")
        target = self.config.escalation_target(request.queue)
        return [
            Link(
                action,
                f"{base}/v1/email/"
                + sign_link(
                    self.broker,
                    request.id,
                    recipient,
                    action,
                    nonce,
                    queue=request.queue,
                    escalations=request.escalations,
                ),
                target if action == "escalate" else None,
            )
            for action in link_actions(request, self.config)
        ]

    def _connect(self) -> smtplib.SMTP:
        target = self.target
        context = ssl.create_default_context()
        try:
            smtp: smtplib.SMTP
            if target.implicit_tls:
                smtp = smtplib.SMTP_SSL(
                    target.host, target.port, timeout=self.timeout_s, context=context
                )
            else:
                smtp = smtplib.SMTP(target.host, target.port, timeout=self.timeout_s)
            try:
                if self.email.starttls and not target.implicit_tls:
                    smtp.starttls(context=context)
                username = self.email.username or target.username
                password = self.email.password or target.password
                if username:
                    smtp.login(username, password or "")
            except BaseException:
                smtp.close()
                raise
        except smtplib.SMTPAuthenticationError as exc:
            raise GiveUp(f"SMTP login refused ({exc.smtp_code})") from None
        except smtplib.SMTPNotSupportedError as exc:
            raise GiveUp(f"SMTP server lacks a needed feature: {exc}") from None
        except smtplib.SMTPResponseException as exc:
            raise _classify(exc) from None
        except (smtplib.SMTPException, OSError) as exc:
            raise Retry(f"SMTP server unreachable: {type(exc).__name__}: {exc}") from None
        return smtp


def _quit(smtp: smtplib.SMTP) -> None:
    try:
        smtp.quit()
    except (smtplib.SMTPException, OSError):
        smtp.close()


def _classify(exc: smtplib.SMTPResponseException) -> Exception:
    """SMTP 4xx is temporary by definition; 5xx is final."""
    raw = exc.smtp_error  # smtplib hands the server's text over as bytes
    message = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    text = f"SMTP {exc.smtp_code}: {message[:200]}"
    return GiveUp(text) if 500 <= exc.smtp_code < 600 else Retry(text)
