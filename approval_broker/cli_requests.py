"""Requests from the shell: `pending` lists what waits, `decide` decides one.

`decide` goes through the same judge as every other channel (`broker.judge.Judge`), as an
operator (no role checks): a repeat is reported, not an error.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from approval_broker.cli_common import DataDir, clear_errors, connect, fail, json_arg
from approval_broker.cli_rules import rule_kept
from broker.domain.models import Decision, Outcome, Request, Status
from broker.domain.principals import operator
from broker.domain.printable import printable
from broker.judge import Judge


class Verb(StrEnum):
    approve = "approve"
    reject = "reject"
    modify = "modify"
    answer = "answer"
    escalate = "escalate"


_VERB_OUTCOME = {
    Verb.approve: Outcome.approved,
    Verb.reject: Outcome.rejected,
    Verb.modify: Outcome.modified,
    Verb.answer: Outcome.answered,
    Verb.escalate: Outcome.escalated,
}


def pending(
    queue: Annotated[str | None, typer.Option(help="Only this handler queue.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
    data_dir: DataDir = None,
) -> None:
    """List the requests that wait for a decision, soonest expiry first (every one: it pages
    through the queue's pending index 500 at a time)."""
    broker = connect(data_dir)
    cursor: str | None = None
    shown = 0
    while True:
        with clear_errors():
            page = broker.requests.list_page(
                status=Status.pending, queue=queue, limit=500, cursor=cursor
            )
        for r in page.items:
            typer.echo(json.dumps(r.public()) if as_json else pending_line(r))
        shown += len(page.items)
        cursor = page.next_cursor
        if cursor is None:
            break
    if not shown and not as_json:
        typer.echo("nothing pending")


def pending_line(r: Request) -> str:
    """One request as a terminal line: tool and args, then the prompt, with no control or
    bidi characters (they come from agents and could rewrite what the operator sees)."""
    args = json.dumps(r.args, ensure_ascii=False, separators=(", ", ": "))
    return printable(
        f"{r.id}  {r.queue:<12} {r.kind:<9} expires {r.expires_at:%Y-%m-%d %H:%M:%S}Z"
        f"  {r.tool_name} {args}  {r.prompt}"
    )


def decide(
    request_id: Annotated[str, typer.Argument(metavar="ID", help="The request id.")],
    verb: Annotated[
        Verb,
        typer.Argument(metavar="approve|reject|modify|answer|escalate", help="What to decide."),
    ],
    reason: Annotated[str | None, typer.Option(help="Why (the model is told, on reject).")] = None,
    args: Annotated[str | None, typer.Option(help="New args as a JSON object (modify).")] = None,
    answer: Annotated[
        str | None, typer.Option(help="The answer (answer); JSON, or plain text.")
    ] = None,
    target: Annotated[
        str | None, typer.Option(help="Queue to escalate to (default: the queue's escalate_to).")
    ] = None,
    by: Annotated[
        str, typer.Option(help="Who decides, as recorded (an operator: no role checks).")
    ] = "cli",
    remember: Annotated[
        int | None,
        typer.Option(
            metavar="N", help="Also keep suggested rule N of the request (approve|reject)."
        ),
    ] = None,
    data_dir: DataDir = None,
) -> None:
    """Decide a pending request from the shell."""
    answer_value: Any = None
    if answer is not None:
        try:
            answer_value = json.loads(answer)
        except json.JSONDecodeError:
            answer_value = answer
    body = {
        "outcome": _VERB_OUTCOME[verb].value,
        "reason": reason,
        "args": json_arg(args, "--args"),
        "answer": answer_value,
        "target": target,
    }
    try:
        decision = Decision.model_validate({k: v for k, v in body.items() if v is not None})
    except ValidationError as exc:
        fail(str(exc.errors()[0]["msg"]).removeprefix("Value error, "))
    broker = connect(data_dir)
    with clear_errors():
        # the same judge as every other channel: a repeat is not an error
        done = Judge(broker).decide(request_id, decision, operator(by), via=(), remember=remember)
    if done.rule is not None:
        typer.echo(rule_kept(done.rule, done.siblings))
    request = done.request
    typer.echo(
        printable(
            f"{request.id}: {request.status.value}"
            + (f" (queue {request.queue})" if request.is_pending else "")
            + ("" if done.recorded else " (already so, nothing changed)")
        )
    )
