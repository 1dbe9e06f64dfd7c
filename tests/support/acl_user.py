"""The README's Redis ACL user on an embedded Redis, for the tests that run the broker as it."""

from __future__ import annotations

import secrets
import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from redis import Redis

from broker.redis.embedded import EmbeddedRedis

README = Path(__file__).resolve().parents[2] / "docs" / "security.md"


def readme_acl() -> list[str]:
    """The `ACL SETUSER approval-broker ...` line of the README, as words."""
    [line] = [ln for ln in README.read_text().splitlines() if ln.startswith("ACL SETUSER ")]
    return shlex.split(line)


@contextmanager
def readme_user(data_dir: Path, *more_rules: str) -> Iterator[tuple[EmbeddedRedis, Redis, str]]:
    """An embedded Redis with the README's user (plus `more_rules`, say `-copy`), its ACL log
    emptied; yields the server, an admin client and that user's URL."""
    with EmbeddedRedis(data_dir) as server:
        password = secrets.token_hex(16)
        words = [password.join(w.split("PASSWORD")) for w in readme_acl()]
        admin = Redis.from_url(server.url)
        assert admin.execute_command(*words, *more_rules) in (b"OK", "OK", True)
        admin.acl_log_reset()
        try:
            yield server, admin, f"redis://approval-broker:{password}@127.0.0.1:{server.port}/0"
        finally:
            admin.close()
