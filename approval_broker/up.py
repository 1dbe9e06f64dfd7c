"""`approval-broker up`: the whole fleet in one process group, for a laptop or a demo.

Each role runs as a child process (as in production, just on one machine); Ctrl-C or SIGTERM
stops them all, process groups included, so no RQ work-horse is left behind. The banner says
which config file was loaded and what it defines; the roles log warnings only unless
`--verbose` (`LOG_LEVEL_ENV`), so the banner stays readable. `--fresh` empties the embedded
Redis first, so a walkthrough never meets what an earlier one used up; `up` without `--demo`
takes back what an earlier `--demo` left (its agent and rule).
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from pathlib import Path

import typer

from approval_broker import running
from approval_broker.start_checks import start_problems
from approval_broker.up_roles import (
    MAX_DEFAULT_WORKERS,
    STOP_S,
    Child,
    default_workers,
    roles,
    stop_all,
)
from broker.domain.config import Config
from broker.domain.errors import BrokerError, ConfigError
from broker.domain.principals import new_token
from broker.domain.rules.config_rules import parse_config_rules
from broker.domain.settings import Settings
from broker.facade import Broker, sync_at_start
from broker.launcher import (
    EmbeddedRedis,
    chosen_fsync,
    cluster_enabled,
    clustered,
    empty,
    redact,
    redis_dir,
    warning_for,
)
from broker.receipts.signing_key import prepare_receipt_key
from channels import prepare as prepare_channels

LOG_LEVEL_ENV = "APPROVAL_BROKER_LOG_LEVEL"
"""The roles' log level (`Settings.log_level`): `up` passes its own (default WARNING), `up
--verbose` INFO (every role's own lines, RQ's line per job and its scheduler)."""

FRESH_NEEDS_EMBEDDED = (
    "--fresh empties the embedded Redis that `up` runs; with APPROVAL_BROKER_REDIS_URL set the "
    "Redis is not up's to empty (unset it, or pass another --data-dir)"
)

API_START_S = 120.0
"""How long `up` waits for the API to answer before it says so: a busy laptop (or CI box) may
take well over 30 s to import every role at once."""


def banner(
    settings: Settings,
    admin_token: str,
    generated: bool,
    demo_runs: list[str],
    ruled_run: str | None = None,
    asked_run: str | None = None,
    tcp_url: str | None = None,
    loaded: list[str] | None = None,
    verbose: bool = False,
) -> str:
    """Where to click; the admin token only if `up` made it (a given one is already known);
    `tcp_url`: the embedded Redis's TCP URL, beside the socket's the roles use; `loaded`: the
    config file and what it defines (`loaded_lines`)."""
    url = f"http://{settings.host}:{settings.port}"
    token = (
        f"{admin_token}   (generated; set APPROVAL_BROKER_ADMIN_TOKEN to keep one)"
        if generated
        else "from APPROVAL_BROKER_ADMIN_TOKEN"
    )
    lines = [
        "",
        "approval-broker is up",
        f"  inbox        {url}/",
        f"  API          {url}/v1/requests   (OpenAPI: {url}/docs)",
        f"  admin token  {token}",
        f"  Redis        {redact(settings.redis_url or '')}",
    ]
    if tcp_url:
        lines.append(f"  Redis (TCP)  {redact(tcp_url)}   (for tools that can't use the socket)")
    lines += loaded or []
    if demo_runs:
        lines.append(f"  demo runs    {', '.join(demo_runs)} (their approvals wait in the inbox)")
    if ruled_run:
        lines.append(
            f"  rule demo    {ruled_run} (its refund is approved by rule demo-routine-refunds)"
        )
    if asked_run:
        lines.append(
            f"  question     {asked_run} (order A105: card or store credit? the inbox shows its form)"
        )
    logs = "Roles log everything (--verbose)." if verbose else "Roles log warnings only (`up --verbose` for everything)."  # fmt: skip
    lines += [f"{logs} Press Ctrl-C to stop.", ""]
    return "\n".join(lines)


def _names(names: list[str], none: str = "none") -> str:
    return ", ".join(names) if names else none


def loaded_lines(
    settings: Settings,
    config: Config,
    *,
    demo_agent: str | None = None,
    demo_rule: str | None = None,
) -> list[str]:
    """The banner's account of the config: which file, and its queues, channels, agents and
    rules by name (what `up --demo` added marked as the demo's), one short line each."""
    channels = sorted({c for q in config.queues.values() for c in q.channels})
    agents = sorted(config.agents)
    if demo_agent and demo_agent not in config.agents:  # the config's own wins (register_demo)
        agents.append(f"{demo_agent} (demo)")
    rules = [rule.id for rule in parse_config_rules(config.rules, config)]
    if demo_rule:
        rules.append(f"{demo_rule} (demo)")
    return [
        f"  config       {settings.config or 'none: the defaults (APPROVAL_BROKER_CONFIG unset)'}",
        f"  queues       {_names(sorted(config.queues))}",
        f"  channels     {_names(channels)}",
        f"  agents       {_names(agents)}",
        f"  rules        {_names(rules)}",
    ]


def wait_healthy(url: str, timeout: float = 30.0) -> bool:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    return False


def check_port_free(host: str, port: int) -> None:
    """Refuse to start when the API's port is taken, rather than restart the API forever.

    Bound as uvicorn binds it (SO_REUSEADDR): a port whose old connections sit in TIME_WAIT
    after a crash is free to listen on, and the API starts at once rather than a minute later.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            raise BrokerError(
                f"{host}:{port} is already in use (another approval-broker?); pass --port"
            ) from None


ONE_REDIS = (
    "`up` runs on one Redis; for a cluster start the roles (api, worker, notifier, sweeper) "
    "as docs say (Redis Cluster)"
)


def check_single_redis(settings: Settings, config: Config, url: str) -> None:
    """Refuse a Redis Cluster in one line (its MOVED replies would otherwise surface raw)."""
    if clustered(settings, config) or cluster_enabled(url):
        raise BrokerError(ONE_REDIS)


def run_up(
    settings: Settings,
    config: Config,
    *,
    demo: bool = False,
    fresh: bool = False,
    verbose: bool = False,
    workers: int | None = None,
) -> None:
    """Start Redis (unless a URL is set) and every role, print where to click, wait for Ctrl-C.

    `fresh`: empty the embedded Redis before anything starts (refused on a Redis `up` doesn't
    run); `verbose`: the roles log at INFO rather than WARNING; `workers`: agent worker
    processes (default: `default_workers()`)."""
    check_port_free(settings.host, settings.port)
    if fresh and settings.redis_url:
        raise BrokerError(FRESH_NEEDS_EMBEDDED)
    problems = start_problems(config)  # what `config check` says: refused before anything starts
    if problems:
        for problem in problems[:-1]:
            typer.echo(f"error: {problem}", err=True)
        raise ConfigError(problems[-1])
    embedded: EmbeddedRedis | None = None
    children: list[Child] = []
    recorded: Path | None = None
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        fsync = chosen_fsync(settings, config)
        if settings.redis_url:
            check_single_redis(settings, config, settings.redis_url)
            warning = warning_for(settings.redis_url, fsync)
            if warning:
                typer.echo(f"[up] warning: {warning}")
        if not settings.redis_url:
            embedded = EmbeddedRedis(redis_dir(settings.data_dir), fsync=fsync)
            typer.echo(
                f"[up] starting embedded Redis (AOF on, appendfsync {fsync}) in"
                f" {embedded.data_dir} ..."
            )
            embedded.start()
            settings.redis_url = embedded.local_url  # the roles run here: the Unix socket
            if fresh:  # before any role starts: nothing can race the emptying
                empty(settings.redis_url)
                typer.echo("[up] --fresh: the embedded Redis starts empty")
            if embedded.socket_path is None:
                typer.echo(
                    f"[up] {embedded.data_dir} is too long a path for a Unix socket: "
                    "the roles use TCP"
                )
        prepare_channels(settings, config)  # refuse now rather than restart the API forever
        prepare_receipt_key(settings, config)  # the roles find the same key file
        generated = not settings.admin_token
        admin_token = settings.admin_token or new_token()
        env = {
            **os.environ,
            "APPROVAL_BROKER_REDIS_URL": settings.redis_url,
            "APPROVAL_BROKER_ADMIN_TOKEN": admin_token,
            "APPROVAL_BROKER_PORT": str(settings.port),
            "APPROVAL_BROKER_HOST": settings.host,
            "APPROVAL_BROKER_KEY_PREFIX": settings.key_prefix,
            "PYTHONUNBUFFERED": "1",
            LOG_LEVEL_ENV: "INFO" if verbose else settings.log_level,
        }
        if settings.config:
            env["APPROVAL_BROKER_CONFIG"] = str(settings.config)
        if settings.data_dir:  # where the roles find the embedded Redis's link secret
            env["APPROVAL_BROKER_DATA_DIR"] = str(settings.data_dir)
        demo_runs: list[str] = []
        ruled_run: str | None = None
        asked_run: str | None = None
        broker = Broker.from_settings(settings, config)  # one Redis: refused a cluster above
        sync_at_start(broker.requests.rules)  # the config's [[rules]], before any run starts
        # before any role starts, so the API never serves a demo that is going away (the
        # demo's runs module loads no agent: `refunds_demo` loads its names lazily)
        from refunds_demo.runs import (
            AGENT_NAME,
            RULE_DEMO,
            add_demo_rule,
            register_demo,
            withdraw_demo,
        )

        if demo:
            register_demo(broker)
            add_demo_rule(broker)
        else:
            for gone in withdraw_demo(broker):  # an earlier --demo's, on a Redis that kept it
                typer.echo(f"[up] no --demo: withdrew the demo's {gone}")
        loaded = loaded_lines(
            settings,
            config,
            demo_agent=AGENT_NAME if demo else None,
            demo_rule=RULE_DEMO["id"] if demo else None,
        )
        if workers is None:
            workers = default_workers()
            typer.echo(
                f"[up] {workers} agent worker process(es): one per core, at most"
                f" {MAX_DEFAULT_WORKERS} (--workers N to choose)"
            )
        for args in roles(workers):
            child = Child(args, env)
            typer.echo(f"[up] starting {child.name} ...")
            child.start()
            children.append(child)
        url = f"http://{settings.host}:{settings.port}"
        if not wait_healthy(url, API_START_S):
            typer.echo(
                f"[up] the API did not answer on {url}/healthz; see its output above", err=True
            )
        if demo:  # queued in Redis: the worker takes them when it is ready, API or not
            from refunds_demo.runs import (
                start_demo_runs,
                start_question_demo_run,
                start_rule_demo_run,
            )

            demo_runs = start_demo_runs(broker)
            ruled_run = start_rule_demo_run(broker)
            asked_run = start_question_demo_run(broker)
        recorded = running.record(
            running.RunningBroker(
                pid=os.getpid(),
                redis_url=settings.redis_url,
                api_url=url,
                data_dir=str(embedded.data_dir.parent.resolve()) if embedded else None,
                config=str(settings.config.resolve()) if settings.config else None,
                key_prefix=settings.key_prefix,
            )
        )  # commands in another shell now find this broker without flags
        tcp_url = embedded.url if embedded and embedded.unix_url else None
        typer.echo(
            banner(
                settings,
                admin_token,
                generated,
                demo_runs,
                ruled_run,
                asked_run,
                tcp_url,
                loaded,
                verbose=verbose,
            )
        )
        while not stop.wait(0.5):
            for child in children:
                if child.process and child.process.poll() is not None and not stop.is_set():
                    typer.echo(
                        f"[up] {child.name} exited with {child.process.returncode}; restarting",
                        err=True,
                    )
                    child.restarts += 1
                    time.sleep(min(5.0, 0.5 * child.restarts))
                    child.start()
    finally:
        if recorded is not None:
            running.remove(recorded)
        typer.echo("[up] stopping ...")
        for name in stop_all(children):
            typer.echo(f"[up] {name} did not stop within {STOP_S:g} s: killed", err=True)
        if embedded:
            embedded.close()
        typer.echo("[up] stopped")
