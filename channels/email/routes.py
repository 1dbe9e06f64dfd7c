"""Email links (`/v1/email/{token}`): GET shows what is asked, POST decides.

Mail scanners follow links, so GET changes nothing: it renders the request and a confirm form.
POST checks everything that can be checked first (signature, age, kind, roles, still pending,
still in the queue the mail was sent for and not escalated since, even away and back, and that
the recipient is on an email list of that queue), then decides through the decision service, which spends the link (single use) in the
same atomic step. An address no approver has decides only through a list that says
`unmapped_may_decide = true`.
Answers are HTML pages, errors too: 410 for a used or expired link, 403 for a forged one, 404
when the request is gone, 409 when it was already decided or has been escalated to another
queue since (that queue's people decide it now), 422 for a form that can't apply.
A structured question's link shows its form (the questions or the schema's fields); an answer
that doesn't fit comes back as the same form, filled in as sent, with each error beside its
input (422), and decides nothing.
"""

from __future__ import annotations

import json
from pathlib import Path as FilePath
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Form, Path, Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates
from starlette.datastructures import FormData

from broker.domain.errors import BrokerError, Conflict, Forbidden
from broker.domain.models import Decision, Outcome
from broker.domain.models import Request as BrokerRequest
from broker.domain.principals import Principal
from broker.domain.questions import InvalidAnswer, answer_text, has_form
from broker.judge.rule_decisions import run_rule_index
from channels.answer_forms import answer_from_form, error_inputs
from channels.email.answer_page import answer_form
from channels.email.config import EmailConfig, email_section
from channels.email.deciders import email_decider
from channels.email.links import LinkClaims, LinkError, link_once, read_link
from channels.errors import Refused, broker_error_status
from channels.inbound import Host, InboundHost

router = APIRouter(prefix="/v1/email", tags=["email"])
templates = Jinja2Templates(directory=str(FilePath(__file__).parent / "templates"))

Token = Annotated[str, Path(min_length=1, max_length=4000, description="the signed link token")]

_VERBS = {
    "approve": "Approve",
    "approve_run": "Approve this and the rest of this run",
    "reject": "Reject",
    "answer": "Answer",
    "escalate": "Escalate",
    "view": "Request",
}
_LINK_PAGES = {
    "link_expired": (410, "This link has expired"),
    "link_used": (410, "This link was already used"),
    "link_invalid": (403, "This link is not valid"),
}
_HTML: dict[str, Any] = {"content": {"text/html": {}}}
_TITLES = {"stale_args": "The request changed", "no_target": "Nowhere to escalate to"}


class PageError(Exception):
    """Answered as an HTML error page."""

    def __init__(self, status: int, error: str, title: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.error, self.title, self.detail = status, error, title, detail


def _email_config(host: InboundHost) -> EmailConfig:
    email = email_section(host.config)
    if email is None:
        raise Refused(404, "not_configured", "email not configured")
    return email


def _page(request: Request, name: str, context: dict[str, Any], status: int = 200) -> HTMLResponse:
    return templates.TemplateResponse(request, name, context, status_code=status)


def _error_page(request: Request, exc: PageError) -> HTMLResponse:
    context = {"error": exc.error, "title": exc.title, "detail": exc.detail}
    return _page(request, "email_error.html", context, exc.status)


def _from_broker_error(exc: BrokerError) -> PageError:
    if isinstance(exc, LinkError):
        status, title = _LINK_PAGES.get(exc.code, (403, "This link is not valid"))
        return PageError(status, exc.code, title, exc.detail)
    if isinstance(exc, Conflict) and exc.code == "escalated":
        return _escalated_elsewhere(exc.request.queue)
    if isinstance(exc, Conflict) and exc.code == "replayed":
        return _from_broker_error(LinkError("this link has already been used", code="link_used"))
    if isinstance(exc, Conflict):
        decision = exc.request.decision
        who = f" by {decision.decided_by}" if decision and decision.decided_by else ""
        return PageError(
            409,
            "conflict",
            "Already decided",
            f"This request was already {exc.request.status.value}{who}.",
        )
    status = broker_error_status(exc)
    titles = {403: "Not allowed", 404: "Request not found", 422: "Can't do that"}
    title = _TITLES.get(exc.code) or titles.get(status, "Can't do that")
    return PageError(status, exc.code, title, exc.detail)


def _load(host: InboundHost, token: str) -> tuple[LinkClaims, BrokerRequest]:
    """The link's claims and its request, refused unless the request still waits in the queue
    the link was mailed for."""
    email = _email_config(host)
    claims = read_link(host.broker, token, email.link_ttl_s)
    item = host.broker.get_request(claims.request_id)
    if not item.is_pending:
        raise Conflict(f"request {item.id} is already {item.status.value}", request=item)
    if claims.queue is not None and item.queue != claims.queue:
        raise _escalated_elsewhere(item.queue)
    if claims.escalations is not None and item.escalations != claims.escalations:
        raise PageError(
            409,
            "escalated",
            "Escalated since",
            f"This request was escalated after this mail was sent (it waits in {item.queue}"
            " now); only a mail sent since then carries links that decide it.",
        )
    return claims, item


def _escalated_elsewhere(queue: str) -> PageError:
    return PageError(
        409,
        "escalated",
        "Escalated elsewhere",
        f"This request was escalated to {queue}; the people of that queue decide it now, so"
        " this link no longer does.",
    )


def _decision(
    claims: LinkClaims, request: BrokerRequest, form: dict[str, str | None], fields: FormData
) -> Decision:
    """What the link and the form ask for; whether it applies is the decision service's call."""
    action = claims.action
    args_hash = form.get("args_hash") or None
    reason = (form.get("reason") or "").strip() or None
    if action in ("approve", "approve_run"):
        return Decision(outcome=Outcome.approved, args_hash=args_hash)
    if action == "reject":
        return Decision(outcome=Outcome.rejected, reason=reason, args_hash=args_hash)
    if action == "escalate":
        return Decision(outcome=Outcome.escalated, reason=reason, args_hash=args_hash)
    if action == "answer" and has_form(request.metadata):
        answer = answer_from_form(request.metadata, fields)
        return Decision(outcome=Outcome.answered, answer=answer, args_hash=args_hash)
    if action == "answer":
        answer = (form.get("answer") or "").strip()
        if not answer and request.kind != "approval":
            raise PageError(422, "invalid", "No answer given", "Type an answer, then send it.")
        return Decision(outcome=Outcome.answered, answer=answer, args_hash=args_hash)
    if action == "view":
        raise PageError(422, "invalid", "Nothing to decide", "This link only shows the request.")
    raise PageError(
        422,
        "wrong_kind",
        "Can't do that",
        f"'{action}' does not apply to a {request.kind} request.",
    )


def _decider(host: InboundHost, recipient: str, item: BrokerRequest) -> tuple[Principal, list[str]]:
    """Who the recipient decides as, and through which lists; a clear refusal for an address
    no approver has, on a list of the request's queue that doesn't let such addresses decide."""
    _email_config(host)
    decider = email_decider(host.config, recipient)
    queue = host.config.queues.get(item.queue)
    channels = set(queue.channels if queue else ())
    held = set(decider.held) & channels
    if not decider.mapped and held and not channels.intersection(decider.via):
        raise Forbidden(
            f"{recipient} is not an approver here, and {', '.join(sorted(held))} does not let"
            " addresses without an approver decide (unmapped_may_decide)"
        )
    return decider.principal, decider.via


async def _form_fields(request: Request) -> FormData:
    """Every field posted (a structured form's inputs have names only the request knows)."""
    return await request.form()


def _confirm(
    request: Request,
    host: InboundHost,
    claims: LinkClaims,
    item: BrokerRequest,
    refused: tuple[FormData, InvalidAnswer] | None = None,
) -> HTMLResponse:
    """The confirmation page; after a refused answer, the form as sent with its errors (422)."""
    submitted, errors, problem = None, None, None
    if refused is not None:
        fields, exc = refused
        submitted = {name: [str(v) for v in fields.getlist(name)] for name in fields}
        errors, problem = error_inputs(exc, item.metadata), exc.detail
    options = item.metadata.get("options")
    context = {
        "item": item,
        "action": claims.action,
        "verb": _VERBS.get(claims.action, "Request"),
        "recipient": claims.recipient,
        "target": host.config.escalation_target(item.queue),
        "args_json": json.dumps(item.args, indent=2, ensure_ascii=False),
        "options": [str(o) for o in options] if isinstance(options, list) else [],
        "form": answer_form(item.metadata, submitted, errors),
        "problem": problem,
    }
    return _page(request, "email_confirm.html", context, 200 if refused is None else 422)


@router.get("/{token}", response_class=HTMLResponse, responses={410: _HTML, 403: _HTML})
def confirm_page(token: Token, request: Request, host: Host) -> HTMLResponse:
    """Show what is asked and a confirm form. Changes nothing."""
    try:
        claims, item = _load(host, token)
    except BrokerError as exc:
        return _error_page(request, _from_broker_error(exc))
    except PageError as exc:
        return _error_page(request, exc)
    return _confirm(request, host, claims, item)


@router.post(
    "/{token}",
    response_class=HTMLResponse,
    responses={409: _HTML, 410: _HTML, 403: _HTML, 422: _HTML},
)
def decide_from_link(
    token: Token,
    request: Request,
    host: Host,
    reason: Annotated[str | None, Form(max_length=10_000)] = None,
    answer: Annotated[str | None, Form(max_length=10_000)] = None,
    args_hash: Annotated[str | None, Form(max_length=128)] = None,
    fields: Annotated[FormData | None, Depends(_form_fields)] = None,
) -> HTMLResponse:
    """Decide as the link's recipient; the link is spent on success."""
    claims: LinkClaims | None = None
    item: BrokerRequest | None = None
    fields = fields if fields is not None else FormData()
    try:
        claims, item = _load(host, token)
        form = {"reason": reason, "answer": answer, "args_hash": args_hash}
        decision = _decision(claims, item, form, fields)
        decider, via = _decider(host, claims.recipient, item)
        once = link_once(host.broker, claims, _email_config(host).link_ttl_s)
        index = run_rule_index(item) if claims.action == "approve_run" else None
        # with `index`, "this tool, this run" is kept with the decision
        decided = host.judge.decide(
            item.id, decision, decider, via=via, current=item, once=once, remember=index
        ).request
    except InvalidAnswer as exc:
        if claims is None or item is None or not has_form(item.metadata):
            return _error_page(request, _from_broker_error(exc))
        return _confirm(request, host, claims, item, refused=(fields, exc))
    except BrokerError as exc:
        return _error_page(request, _from_broker_error(exc))
    except PageError as exc:
        return _error_page(request, exc)
    done = {"item": decided, "action": claims.action, "answer": _answer_shown(decided)}
    return _page(request, "email_done.html", done)


def _answer_shown(item: BrokerRequest) -> str | None:
    """The recorded answer as the agent reads it, for the page that says it was recorded."""
    if item.decision is None or item.decision.answer is None or not has_form(item.metadata):
        return None
    return answer_text(item.metadata, item.decision.answer)
