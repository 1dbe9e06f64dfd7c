"""`approval-broker`: run the fleet's roles and operate the broker from a shell.

Errors print one line and exit non-zero; `--help` works on every command.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from redis.exceptions import RedisError

from approval_broker.rules_cli import remember_with, rules_app
from broker import connection
from broker.auth import hash_token, new_token, operator
from broker.client import Broker
from broker.cluster import clustered
from broker.config import Config, Settings, check_admin_token, load_config
from broker.deciding import Deciding
from broker.errors import BrokerError, Conflict
from broker.links import prepare_link_secret
from broker.models import Decision, Outcome, Request, Status
from broker.printable import printable
from broker.redis_server import EmbeddedRedis, redact, running_url

app = typer.Typer(
    help="A queue-backed approval broker for AI agents: requests wait for a person, runs resume.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
token_app = typer.Typer(help="Manage approver tokens.", no_args_is_help=True)
app.add_typer(token_app, name="token")
app.add_typer(rules_app, name="rules")


DataDir = Annotated[
    Path | None,
    typer.Option(
        "--data-dir", help="Where the embedded Redis keeps its data (default: your user data dir)."
    ),
]


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


def fail(message: str, code: int = 1) -> None:
    typer.echo(f"error: {printable(message)}", err=True)
    raise typer.Exit(code)


@contextmanager
def clear_errors() -> Iterator[None]:
    """Turn the errors a user can cause into one line and a non-zero exit."""
    try:
        yield
    except Conflict as exc:
        fail(
            f"{exc.detail} (decision: {json.dumps(exc.request.decision.public() if exc.request.decision else None)})"
        )
    except BrokerError as exc:
        fail(exc.detail)
    except RedisError as exc:
        fail(f"Redis: {exc}")


def load_settings(data_dir: Path | None = None) -> tuple[Settings, Config]:
    with clear_errors():
        settings = Settings()
        if data_dir is not None:
            settings.data_dir = data_dir
        return settings, load_config(settings.config)
    raise AssertionError("unreachable")


def connect(data_dir: Path | None = None) -> Broker:
    """A broker on APPROVAL_BROKER_REDIS_URL, else on the embedded Redis that `up` is running."""
    settings, config = load_settings(data_dir)
    url = settings.redis_url or running_url(settings.data_dir and settings.data_dir / "redis")
    if not url:
        fail("no Redis: set APPROVAL_BROKER_REDIS_URL, or start `approval-broker up` first")
    if clustered(settings, config):  # the cluster for the broker's keys, RQ's own Redis
        with clear_errors():
            broker = Broker.from_settings(settings, config)
            broker.redis.ping()
        return broker
    redis = connection.connect(url)  # type: ignore[arg-type]
    with clear_errors():
        redis.ping()
    return Broker(redis, config, prefix=settings.key_prefix)


def _json_arg(value: str | None, name: str) -> Any:
    if value is None:
        return None
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        fail(f"{name} is not valid JSON: {exc.msg} at position {exc.pos}")


@app.command()
def up(
    demo: Annotated[
        bool, typer.Option(help="Also register the demo refunds agent and start two runs.")
    ] = False,
    port: Annotated[int | None, typer.Option(help="HTTP port (env APPROVAL_BROKER_PORT).")] = None,
    data_dir: DataDir = None,
) -> None:
    """Run everything in one process group on an embedded Redis (unless APPROVAL_BROKER_REDIS_URL is set)."""
    from approval_broker.up import run_up

    settings, config = load_settings(data_dir)
    if port is not None:
        settings.port = port
    with clear_errors():
        check_admin_token(settings)
        run_up(settings, config, demo=demo)


@contextmanager
def role(data_dir: Path | None, port: int | None = None) -> Iterator[tuple[Settings, Config]]:
    """Settings for a fleet role with `redis_url` filled in.

    With APPROVAL_BROKER_REDIS_URL unset, a role joins the embedded Redis that `up` runs, or
    starts its own (and stops it on exit).
    """
    settings, config = load_settings(data_dir)
    if port is not None:
        settings.port = port
    embedded: EmbeddedRedis | None = None
    with clear_errors():
        if not settings.redis_url:
            settings.redis_url = running_url(settings.data_dir and settings.data_dir / "redis")
        if not settings.redis_url:
            embedded = EmbeddedRedis(settings.data_dir and settings.data_dir / "redis").start()
            settings.redis_url = embedded.url
            typer.echo(
                f"started embedded Redis at {redact(embedded.url)} (data in {embedded.data_dir})",
                err=True,
            )
        try:
            yield settings, config
        except KeyboardInterrupt:
            pass
        finally:
            if embedded:
                embedded.close()


@app.command()
def api(
    port: Annotated[
        int | None, typer.Option(help="HTTP port (env APPROVAL_BROKER_PORT, default 8000).")
    ] = None,
    host: Annotated[
        str | None, typer.Option(help="Address to listen on (default 127.0.0.1).")
    ] = None,
    data_dir: DataDir = None,
) -> None:
    """Serve the HTTP API, Slack/email/webhook replies and the inbox (uvicorn)."""
    from api.server import serve

    with clear_errors():
        check_admin_token(load_settings(data_dir)[0])
    with role(data_dir, port) as (settings, config):
        if host:
            settings.host = host
        prepare_link_secret(settings, config)
        serve(settings, config)


@app.command()
def worker(
    resumer: Annotated[bool, typer.Option(help="Also run the resumer in this process.")] = True,
    burst: Annotated[bool, typer.Option(help="Exit when the queue is empty.")] = False,
    data_dir: DataDir = None,
) -> None:
    """Run an RQ agent worker on queue `agent-runs` (and, by default, the resumer)."""
    from workers.worker import run_worker

    with role(data_dir) as (settings, config):
        run_worker(settings, config, with_resumer=resumer, burst=burst)


@app.command()
def resumer(data_dir: DataDir = None) -> None:
    """Move fully answered rounds from the `resumes` outbox onto the RQ queue, exactly once."""
    from workers.resumer import run_resumer

    with role(data_dir) as (settings, config):
        run_resumer(settings, config)


@app.command()
def notifier(data_dir: DataDir = None) -> None:
    """Deliver requests and outcomes to the channels of each handler queue."""
    from notifiers.runner import run_notifier

    with role(data_dir) as (settings, config):
        prepare_link_secret(settings, config)
        run_notifier(settings, config)


@app.command()
def sweeper(
    interval: Annotated[
        float, typer.Option(help="Seconds between sweeps when nothing is due.")
    ] = 0.25,
    data_dir: DataDir = None,
) -> None:
    """Escalate or time out requests whose time is up."""
    from workers.sweeper import run_sweeper

    with role(data_dir) as (settings, config):
        run_sweeper(settings, config, interval=interval)


@app.command()
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


@app.command()
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
        "args": _json_arg(args, "--args"),
        "answer": answer_value,
        "target": target,
    }
    try:
        decision = Decision.model_validate({k: v for k, v in body.items() if v is not None})
    except ValidationError as exc:
        fail(str(exc.errors()[0]["msg"]).removeprefix("Value error, "))
    broker = connect(data_dir)
    with clear_errors():
        # the same decision service as every other channel: a repeat is not an error
        if remember is not None:
            done = remember_with(Deciding(broker), request_id, decision, operator(by), remember)
        else:
            done = Deciding(broker).decide(request_id, decision, operator(by), via=())
    request = done.request
    typer.echo(
        printable(
            f"{request.id}: {request.status.value}"
            + (f" (queue {request.queue})" if request.is_pending else "")
            + ("" if done.recorded else " (already so, nothing changed)")
        )
    )


@app.command("dead-letters")
def dead_letters(
    count: Annotated[int, typer.Option(help="How many to show.")] = 100,
    redrive_all: Annotated[
        bool,
        typer.Option("--redrive", help="Also put every listed one back on its stream."),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
    data_dir: DataDir = None,
) -> None:
    """List dead letters: deliveries and entries that could not be handled, with their cause."""
    broker = connect(data_dir)
    with clear_errors():
        rows = broker.dead_letters(count)
    if not rows and not as_json:
        typer.echo("no dead letters")
    for entry_id, fields in rows:
        if as_json:
            typer.echo(json.dumps({"id": entry_id, **fields}))
            continue
        what = " ".join(x for x in (fields.get("f.type"), fields.get("f.request_id")) if x)
        typer.echo(
            f"{entry_id}  {fields.get('at', '?')[:19]}  {fields.get('source', '?')}"
            f"{'  ' + what if what else ''}: {fields.get('error', '?')}"
        )
    if redrive_all:
        with clear_errors():
            for entry_id, fields in rows:
                if fields.get("stream"):
                    broker.redrive(entry_id)
                    typer.echo(f"{entry_id}: re-driven")
                else:
                    typer.echo(f"{entry_id}: not from a stream; left as is")


@app.command("redrive")
def redrive(
    entry_ids: Annotated[
        list[str], typer.Argument(metavar="ENTRY_ID...", help="Dead letters to put back.")
    ],
    data_dir: DataDir = None,
) -> None:
    """Put dead letters back on the stream they came from, to be handled again."""
    broker = connect(data_dir)
    with clear_errors():
        for entry_id in entry_ids:
            broker.redrive(entry_id)
            typer.echo(f"{entry_id}: re-driven")


@token_app.command("new")
def token_new(
    name: Annotated[str, typer.Argument(help="The approver's name, as in [approvers.NAME].")],
) -> None:
    """Print a fresh token (once) and the config line that accepts it."""
    if not name.replace("-", "").replace("_", "").isalnum():
        fail(f"approver name {name!r} may hold only letters, digits, '-' and '_'")
    token = new_token()
    typer.echo(f"token for {name} (shown once, keep it secret): {token}")
    typer.echo("add to your config:")
    typer.echo(f"[approvers.{name}]")
    typer.echo(f'token_sha256 = "{hash_token(token)}"')


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
