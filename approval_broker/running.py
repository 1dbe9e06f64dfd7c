"""Where the brokers that `up` runs for this user are, so commands in another shell find them.

`up` writes one small JSON record per process into the user's state directory
(`platformdirs.user_state_dir("approval-broker")/running/PID.json`; `XDG_STATE_HOME` moves
it): its data dir, its Redis URL, its API's URL, the config file and key prefix. The record is
written atomically (a temporary file, fsynced, renamed over), readable by the user only (a
Redis URL may carry a password), and removed when `up` exits; a record whose process is gone
(`up` was killed) is ignored, and removed by the next reader.

Commands that talk to a broker (`cli_common.connect`) use a record only when neither a flag
nor the environment says where the broker is.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from platformdirs import user_state_dir

APP = "approval-broker"


@dataclass(frozen=True)
class RunningBroker:
    """What one `up` tells the commands of the same user."""

    pid: int
    redis_url: str
    api_url: str
    data_dir: str | None = None
    config: str | None = None
    key_prefix: str = "ab:"

    def how_to_reach(self) -> str:
        """The flag or variable that names this broker, for a message."""
        if self.data_dir:
            return f"--data-dir {self.data_dir}"
        return "APPROVAL_BROKER_REDIS_URL=<its Redis URL>"


def records_dir() -> Path:
    return Path(user_state_dir(APP)) / "running"


def record(found: RunningBroker) -> Path:
    """Write `found`'s record atomically (durable before it is visible); its path."""
    where = records_dir()
    where.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = where / f"{found.pid}.json"
    tmp = where / f".{found.pid}.json.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, json.dumps(asdict(found)).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(where, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return path


def remove(path: Path) -> None:
    """Take a record back (on `up`'s clean exit)."""
    path.unlink(missing_ok=True)


def alive(pid: int) -> bool:
    """Whether process `pid` still runs and is an approval-broker (not a reused pid)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone's process: it exists
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # no /proc: the pid is all there is to go on
    return b"approval" in cmdline


def running() -> list[RunningBroker]:
    """The brokers `up` runs for this user now, oldest record first (stale ones dropped)."""
    where = records_dir()
    if not where.is_dir():
        return []
    found: list[tuple[float, RunningBroker]] = []
    for path in where.glob("*.json"):
        try:
            data = json.loads(path.read_text())
            entry = RunningBroker(**data)
            mtime = path.stat().st_mtime
        except (OSError, ValueError, TypeError):
            continue  # half a record of another version, or gone meanwhile: not ours to read
        if alive(entry.pid):
            found.append((mtime, entry))
        else:
            path.unlink(missing_ok=True)  # its `up` was killed: nobody else will take it back
    return [entry for _, entry in sorted(found, key=lambda pair: pair[0])]
