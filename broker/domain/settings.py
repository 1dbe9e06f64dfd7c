"""The APPROVAL_BROKER_* environment (contract: docs/internals.md): where Redis is, which
config file, the admin token, where the API listens.

Apart from the TOML config (`broker.domain.config`): the environment says where a process runs,
the config what the broker does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from broker.domain.errors import ConfigError

MIN_ADMIN_TOKEN_CHARS = 24
RedisFsync = Literal["always", "everysec"]
"""When Redis fsyncs its AOF (`appendfsync`): `always`, before it answers a write (a crash of
Redis or of the machine loses nothing acknowledged); `everysec`, about once a second (a crash
can lose the last 1-2 s of acknowledged writes). `broker.redis.durability` says more."""


class Settings(BaseSettings):
    """The APPROVAL_BROKER_* environment (contract: docs/internals.md)."""

    model_config = SettingsConfigDict(env_prefix="APPROVAL_BROKER_", extra="ignore")

    redis_url: str | None = None
    config: Path | None = None
    admin_token: str | None = None
    port: int = 8000
    host: str = "127.0.0.1"
    key_prefix: str = "ab:"
    data_dir: Path | None = None
    redis_cluster: bool = (
        False  # REDIS_URL names a node of a Redis Cluster (broker/redis/cluster.py)
    )
    rq_redis_url: str | None = None  # RQ's own single Redis; required when clustered
    # the embedded Redis's appendfsync; unset: `[broker] redis_fsync` (default "always")
    redis_fsync: RedisFsync | None = None
    # The roles' log level: `up` passes WARNING (its banner stays readable), `up --verbose` INFO
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "WARNING"

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper_level(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value


def check_admin_token(settings: Settings) -> None:
    """Refuse a guessable admin token at start: it has every role on every request."""
    token = settings.admin_token
    if token and len(token) < MIN_ADMIN_TOKEN_CHARS:
        raise ConfigError(
            f"APPROVAL_BROKER_ADMIN_TOKEN is {len(token)} characters; it needs at least"
            f" {MIN_ADMIN_TOKEN_CHARS} (make one with `approval-broker token new admin`)"
        )
