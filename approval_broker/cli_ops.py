"""Operator commands: check a config before deploying it, see the fleet's state, read a run,
make a webhook secret.

Each answers what an operator asks at 3 a.m. without opening Redis: `config check` loads a
file exactly as every role does at start (the same one-line error, non-zero); `status` reads
only (queue depths, dead letters, the notifiers' consumers, RQ's workers, Redis and how durable
it is); `runs show` prints a run as `GET /v1/runs/{id}` does. None of them changes state.
"""

from __future__ import annotations

import base64
import json
import secrets
from pathlib import Path
from typing import Annotated, Any

import typer
from rq import Worker

from approval_broker.cli_common import DataDir, clear_errors, connect, fail
from approval_broker.start_checks import start_problems
from broker.domain.config import Config, load_config
from broker.domain.errors import ConfigError
from broker.domain.printable import printable
from broker.domain.rules.config_rules import parse_config_rules
from broker.domain.settings import RedisFsync, Settings
from broker.facade import Broker
from broker.launcher import DEFAULT_FSYNC, Durability, chosen_fsync
from broker.runs.starting import run_queue

config_app = typer.Typer(help="Check a config file.", no_args_is_help=True)
runs_app = typer.Typer(help="Agent runs on the fleet.", no_args_is_help=True)
webhook_app = typer.Typer(help="Standard Webhooks endpoints.", no_args_is_help=True)

SECRET_BYTES = 32
"""A new `whsec_` secret's key size: the config takes 24 to 64 bytes."""


@config_app.command("check")
def config_check(
    file: Annotated[
        Path | None,
        typer.Argument(help="The TOML file (default: APPROVAL_BROKER_CONFIG, else the defaults)."),
    ] = None,
) -> None:
    """Load a config as every role does at start and print what it defines.

    Exits 0 with a summary of the queues (channels, timeout, escalation), agents, approvers and
    rules; exits 1 with the one-line error `up` would give (a line each when the config parses
    but the machine lacks what it needs: a channel's extra, an agent that doesn't import).
    """
    path = file if file is not None else Settings().config
    try:
        config = load_config(path)
    except ConfigError as exc:
        fail(str(exc))
    problems = start_problems(config)
    if problems:
        for problem in problems[:-1]:
            typer.echo(f"error: {printable(problem)}", err=True)
        fail(problems[-1])
    typer.echo(f"config {path or '(none: the defaults)'}: ok")
    for line in summary(config):
        typer.echo(line)


def summary(config: Config) -> list[str]:
    """What a config defines, one line each."""
    lines = []
    for name, queue in sorted(config.queues.items()):
        then = f", then {queue.escalate_to}" if queue.escalate_to else ", then timed_out"
        extra = f", quorum {queue.quorum}" if queue.quorum > 1 else ""
        roles = f", roles {', '.join(queue.roles)}" if queue.roles else ""
        lines.append(
            f"queue {name}: {', '.join(queue.channels) or 'no channel'};"
            f" waits {queue.timeout_s:g} s{then}{extra}{roles}"
        )
    for name, agent in sorted(config.agents.items()):
        lines.append(f"agent {name}: {agent.path} (queue {agent.queue})")
    for name, approver in sorted(config.approvers.items()):
        lines.append(f"approver {name}: roles {', '.join(sorted(approver.roles)) or 'none'}")
    for kind, section in sorted(config.channel_sections.items()):
        for name in sorted(section.channel_names()):
            where = section.describe(name)
            lines.append(f"channel {kind}:{name}" + (f": {where}" if where else ""))
    for rule in parse_config_rules(config.rules, config):
        lines.append(f"rule {rule.id}: {rule.effect} {rule.tool}")
    return lines


@runs_app.command("show")
def runs_show(
    run_id: Annotated[str, typer.Argument(help="The run's id (run_...).")],
    data_dir: DataDir = None,
) -> None:
    """Print one run as JSON: status, round, pending request ids, output or error."""
    broker = connect(data_dir)
    with clear_errors():
        run = broker.get_run(run_id)
    typer.echo(json.dumps(run.public(), indent=2))


@webhook_app.command("secret")
def webhook_secret() -> None:
    """Print a fresh Standard Webhooks secret (`whsec_` and 32 random bytes, base64) for a
    `[webhooks.NAME] secret`."""
    typer.echo("whsec_" + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode())


def status(
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object.")] = False,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Also one line per worker slot.")
    ] = False,
    data_dir: DataDir = None,
) -> None:
    """The fleet at a glance: Redis, queue depths, dead letters, notifiers and agent workers
    (summed up: processes, slots, busy; `--verbose` lists every slot)."""
    broker = connect(data_dir)
    with clear_errors():
        report = fleet_status(broker, chosen_fsync(Settings(), broker.config))
    if as_json:
        typer.echo(json.dumps(report, indent=2))
        return
    redis = report["redis"]
    typer.echo(
        f"redis: {redis['version']}, {redis['used_memory_human']} used,"
        f" answered in {redis['ping_ms']:.1f} ms"
    )
    if redis["durability"] is not None:
        typer.echo(f"redis durability: {Durability(**redis['durability']).describe()}")
    if redis["durability_warning"]:
        typer.echo(f"warning: {redis['durability_warning']}")
    for name, depth in report["queues"].items():
        typer.echo(f"queue {name}: {depth} pending")
    typer.echo(f"agent runs queued: {report['runs_queued']}")
    typer.echo(f"dead letters: {report['dead_letters']}")
    for consumer in report["notifiers"]:
        typer.echo(
            f"notifier {consumer['name']} on {consumer['queue']}: seen"
            f" {consumer['idle_s']:.0f} s ago, {consumer['pending']} unacknowledged"
        )
    if not report["notifiers"]:
        typer.echo("notifiers: none has read yet")
    if not report["workers"]:
        typer.echo("agent workers: none alive")
        return
    summed = report["worker_summary"]
    typer.echo(
        f"workers: {plural(summed['processes'], 'process', 'processes')},"
        f" {plural(summed['slots'], 'slot')}, {summed['busy']} busy"
    )
    if verbose:
        for worker in report["workers"]:
            typer.echo(f"worker {worker['name']}: {worker['state']}")


def plural(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else many or one + 's'}"


def worker_summary(workers: list[dict[str, Any]]) -> dict[str, int]:
    """RQ's workers summed up: an `approval-broker worker` process registers one RQ worker per
    slot (`workers.slots`), all with its host and pid, so processes are distinct (host, pid)."""
    return {
        "processes": len({(w["hostname"], w["pid"]) for w in workers}),
        "slots": len(workers),
        "busy": sum(1 for w in workers if w["state"] == "busy"),
    }


def fleet_status(broker: Broker, chosen: RedisFsync = DEFAULT_FSYNC) -> dict[str, Any]:
    """Read-only figures about the fleet, as `status` prints them; `redis.durability` is what a
    single Redis says of its AOF (None on a cluster), with a warning when it keeps less than
    `chosen`."""
    names = sorted(broker.config.queues)
    report = {
        "redis": broker.fleet.server(chosen),
        "queues": broker.requests.pending_counts(names),
        "runs_queued": run_queue(broker).count,
        "dead_letters": broker.fleet.dead_letter_count(),
        "notifiers": broker.fleet.notifier_consumers(names),
    }
    workers = [
        {"name": w.name, "state": str(w.get_state()), "hostname": w.hostname, "pid": w.pid}
        for w in Worker.all(connection=broker.rq_connection)
    ]
    return {**report, "workers": workers, "worker_summary": worker_summary(workers)}
