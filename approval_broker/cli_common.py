"""What every command shares: one-line errors, the settings, and a broker to talk to.

A user's mistake (bad input, a missing request, Redis down) becomes one line on stderr and a
non-zero exit, never a traceback; commands never catch more than this module names.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from pydantic import ValidationError
from redis.exceptions import RedisError

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


def connect(data_dir: Path | None = None) -> Broker:
    """A broker on APPROVAL_BROKER_REDIS_URL, else on the embedded Redis that `up` is running."""
    settings, config = load_settings(data_dir)
    with clear_errors():
        broker = joined(settings, config)
    if broker is None:
        fail("no Redis: set APPROVAL_BROKER_REDIS_URL, or start `approval-broker up` first")
    with clear_errors():
        broker.fleet.ping()
    return broker
