"""What every command shares: one-line errors, the settings, and a broker to talk to.

A user's mistake (bad input, a missing request, Redis down) becomes one line on stderr and a
non-zero exit, never a traceback; commands never catch more than this module names.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from pydantic import ValidationError
from redis.exceptions import RedisError

from approval_broker.running import RunningBroker, running
from broker.domain.config import Config, load_config
from broker.domain.errors import BrokerError, Conflict
from broker.domain.printable import printable
from broker.domain.settings import Settings
from broker.facade import Broker
from broker.launcher import joined

DataDir = Annotated[
    Path | None,
    typer.Option(
        "--data-dir", help="Where the embedded Redis keeps its data (default: your user data dir)."
    ),
]


def fail(message: str, code: int = 1) -> NoReturn:
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
    except ValidationError as exc:  # a bad APPROVAL_BROKER_* value (Settings)
        error = exc.errors()[0]
        name = "APPROVAL_BROKER_" + str(error["loc"][0]).upper() if error["loc"] else "environment"
        fail(f"{name}: {error['msg']}")


def json_arg(value: str | None, name: str) -> Any:
    """An option given as JSON, parsed (None when not given)."""
    if value is None:
        return None
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        fail(f"{name} is not valid JSON: {exc.msg} at position {exc.pos}")


def load_settings(data_dir: Path | None = None) -> tuple[Settings, Config]:
    with clear_errors():
        settings = Settings()
        if data_dir is not None:
            settings.data_dir = data_dir
        return settings, load_config(settings.config)
    raise AssertionError("unreachable")


NOTHING_RUNS = (
    "no broker is running for this user: start `approval-broker up`, or pass --data-dir DIR"
    " (the one `up` was given), or set APPROVAL_BROKER_REDIS_URL"
)


def connect(data_dir: Path | None = None) -> Broker:
    """A broker to talk to: the one `--data-dir` or the APPROVAL_BROKER_* environment names,
    else the one `up` runs for this user (`approval_broker.running`), else the embedded Redis
    of the default data dir; one line saying what to pass when there is none."""
    with clear_errors():
        settings = Settings()
    told = data_dir is not None or settings.redis_url or settings.data_dir
    if data_dir is not None:
        settings.data_dir = data_dir
    if not told:
        found = running_broker()
        if found is not None:
            settings.redis_url = found.redis_url
            settings.data_dir = Path(found.data_dir) if found.data_dir else None
            if "APPROVAL_BROKER_KEY_PREFIX" not in os.environ:
                settings.key_prefix = found.key_prefix
            if settings.config is None and found.config:
                settings.config = Path(found.config)
    with clear_errors():
        config = load_config(settings.config)
        broker = joined(settings, config)
    if broker is None:
        if told and settings.data_dir is not None:
            fail(
                f"no broker is running with data dir {settings.data_dir}: start"
                f" `approval-broker up --data-dir {settings.data_dir}`, or set"
                " APPROVAL_BROKER_REDIS_URL"
            )
        fail(NOTHING_RUNS)
    with clear_errors():
        broker.fleet.ping()
    return broker


def running_broker() -> RunningBroker | None:
    """The one broker `up` runs for this user, None when none does; refused in one line when
    several do (which one is for the user to say)."""
    found = running()
    if len(found) > 1:
        fail(
            "several brokers are running for this user; say which: "
            + " or ".join(entry.how_to_reach() for entry in found)
        )
    return found[0] if found else None
