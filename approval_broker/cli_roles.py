"""The fleet's roles as commands: `up`, `api`, `worker`, `resumer`, `notifier`, `sweeper`.

Each role runs until interrupted; without APPROVAL_BROKER_REDIS_URL it joins the embedded Redis
that `up` runs, or starts its own. The roles' code lives in `api`, `workers` and `notifiers`,
imported only by the command that runs it (a shell command need not load a web server).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from approval_broker.cli_common import DataDir, clear_errors, load_settings
from broker.domain.config import Config
from broker.domain.settings import Settings, check_admin_token
from broker.launcher import (
    EmbeddedRedis,
    chosen_fsync,
    clustered,
    redact,
    running_local_url,
    warning_for,
)
from broker.receipts.signing_key import prepare_receipt_key
from broker.tracing import telemetry as tracing
from channels import check_installed
from channels import prepare as prepare_channels


def up(
    demo: Annotated[
        bool,
        typer.Option(
            help="Also register the demo refunds agent and its rule, and start four runs: two "
            "refunds and a question that wait in the inbox, and a refund the rule approves."
        ),
    ] = False,
    fresh: Annotated[
        bool,
        typer.Option(
            help="Empty the embedded Redis first: no request, run, rule or demo refund of an "
            "earlier `up` is left (refused with APPROVAL_BROKER_REDIS_URL set)."
        ),
    ] = False,
    verbose: Annotated[
        bool, typer.Option(help="The roles log everything (INFO), not only warnings.")
    ] = False,
    port: Annotated[int | None, typer.Option(help="HTTP port (env APPROVAL_BROKER_PORT).")] = None,
    data_dir: DataDir = None,
    workers: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=64,
            help="Agent worker processes; each runs [workers] concurrency agent runs at once, "
            "on one event loop (one core at most). Default: one per core, at most 4.",
        ),
    ] = None,
) -> None:
    """Run everything in one process group on an embedded Redis (unless APPROVAL_BROKER_REDIS_URL is set)."""
    from approval_broker.up import run_up

    settings, config = load_settings(data_dir)
    if port is not None:
        settings.port = port
    with clear_errors():
        check_admin_token(settings)
        run_up(settings, config, demo=demo, fresh=fresh, verbose=verbose, workers=workers)


@contextmanager
def role(
    data_dir: Path | None, port: int | None = None, *, name: str
) -> Iterator[tuple[Settings, Config]]:
    """Settings for a fleet role with `redis_url` filled in, traced as `name` when the `OTEL_*`
    environment asks for traces (`broker.tracing.telemetry`).

    With APPROVAL_BROKER_REDIS_URL unset, a role joins the embedded Redis that `up` runs, or
    starts its own (and stops it on exit), over its Unix socket when it has one.
    """
    settings, config = load_settings(data_dir)
    if port is not None:
        settings.port = port
    # the role's own loggers; `up` passes WARNING so its banner stays readable, --verbose INFO
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(name)s %(message)s")
    embedded: EmbeddedRedis | None = None
    with clear_errors():
        here = settings.data_dir and settings.data_dir / "redis"
        if settings.redis_url and not clustered(settings, config):  # a Redis of the operator's
            warning = warning_for(settings.redis_url, chosen_fsync(settings, config))
            if warning:
                typer.echo(f"warning: {warning}", err=True)
        if not settings.redis_url:
            settings.redis_url = running_local_url(here)
        if not settings.redis_url:
            embedded = EmbeddedRedis(here, fsync=chosen_fsync(settings, config)).start()
            settings.redis_url = embedded.local_url
            typer.echo(
                f"started embedded Redis at {redact(embedded.local_url)} (data in {embedded.data_dir})",
                err=True,
            )
        prepare_receipt_key(settings, config)
        try:
            with tracing.configured(name):
                yield settings, config
        except KeyboardInterrupt:
            pass
        finally:
            if embedded:
                embedded.close()


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
        settings, config = load_settings(data_dir)
        check_admin_token(settings)
        check_installed(config)  # before a Redis is started or joined
    with role(data_dir, port, name="api") as (settings, config):
        if host:
            settings.host = host
        prepare_channels(settings, config)
        serve(settings, config)


def worker(
    resumer: Annotated[bool, typer.Option(help="Also run the resumer in this process.")] = True,
    burst: Annotated[bool, typer.Option(help="Exit when the queue is empty.")] = False,
    concurrency: Annotated[
        int | None,
        typer.Option(
            min=1, max=1000, help="Agent runs at once in this process ([workers] concurrency, 50)."
        ),
    ] = None,
    data_dir: DataDir = None,
) -> None:
    """Run an agent worker on queue `agent-runs`: many runs at once (and, by default, the resumer)."""
    from workers.worker import run_worker

    with role(data_dir, name="worker") as (settings, config):
        run_worker(settings, config, with_resumer=resumer, burst=burst, concurrency=concurrency)


def resumer(data_dir: DataDir = None) -> None:
    """Move fully answered rounds from the `resumes` outbox onto the RQ queue, exactly once."""
    from workers.resumer import run_resumer

    with role(data_dir, name="resumer") as (settings, config):
        run_resumer(settings, config)


def notifier(data_dir: DataDir = None) -> None:
    """Deliver requests and outcomes to the channels of each handler queue."""
    from notifiers.runner import run_notifier

    with clear_errors():
        check_installed(load_settings(data_dir)[1])  # before a Redis is started or joined
    with role(data_dir, name="notifier") as (settings, config):
        prepare_channels(settings, config)
        run_notifier(settings, config)


def sweeper(
    interval: Annotated[
        float, typer.Option(help="Seconds between sweeps when nothing is due.")
    ] = 0.25,
    data_dir: DataDir = None,
) -> None:
    """Escalate or time out requests whose time is up."""
    from workers.sweeper import run_sweeper

    with role(data_dir, name="sweeper") as (settings, config):
        run_sweeper(settings, config, interval=interval)
