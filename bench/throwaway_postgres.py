"""A throwaway PostgreSQL for the benches' durable peers, and what it spends.

Debian's `postgresql` package, a temp dir, a free loopback port, fsync on (a commit is on disk
before it returns, as the broker's Redis fsyncs every write). Besides its URI it tells its CPU
so far (every server process, the ones that already exited included) and two counters that say
what a side wrote durably: write transactions (transaction ids handed out) and WAL bytes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from benchlib import cpu_seconds

from broker.redis.embedded import free_port


@dataclass(frozen=True)
class Postgres:
    uri: str
    """`postgresql://bench@127.0.0.1:PORT/postgres` (trust auth, loopback only)."""
    data: Path

    def cpu_seconds(self) -> float:
        """CPU (user + system) of the server so far: the postmaster, its live backends, and
        those that exited (the postmaster's reaped children's time)."""
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        try:
            fields = Path(f"/proc/{postmaster}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        reaped = (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")
        children = [
            int(stat.parent.name)
            for stat in Path("/proc").glob("[0-9]*/stat")
            if _parent(stat) == postmaster
        ]
        return cpu_seconds(postmaster) + reaped + sum(cpu_seconds(pid) for pid in children)

    async def counters(self) -> tuple[int, int]:
        """(next transaction id, WAL position in bytes): their growth over a phase is the
        write transactions it committed (or aborted) and the WAL it wrote, the whole server's."""
        import psycopg

        async with await psycopg.AsyncConnection.connect(self.uri, autocommit=True) as conn:
            cursor = await conn.execute(
                "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint,"
                " (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint"
            )
            row = await cursor.fetchone()
        assert row is not None
        return int(row[0]), int(row[1])


def _parent(stat: Path) -> int:
    with contextlib.suppress(OSError, IndexError, ValueError):
        return int(stat.read_text().rsplit(")", 1)[1].split()[1])
    return 0


@contextlib.contextmanager
def postgres(tmp: Path | None = None) -> Iterator[Postgres]:
    """A throwaway PostgreSQL (fsync on) on a free loopback port, removed on exit."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if not found:
        raise SystemExit(
            "PostgreSQL is not installed: apt-get update && apt-get install -y postgresql"
        )
    bin_dir = found[-1].parent
    tmp = Path(tempfile.mkdtemp(prefix="bench-pg-", dir=tmp or tempfile.gettempdir()))
    tmp.chmod(0o755)
    data = tmp / "pg"
    data.mkdir()
    port = free_port()
    run: list[str] = []
    if os.geteuid() == 0:  # initdb refuses root
        shutil.chown(tmp, "postgres")
        shutil.chown(data, "postgres")
        run = ["runuser", "-u", "postgres", "--"]
    subprocess.run([*run, str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", "bench"],
                   check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    opts = f"-p {port} -k {tmp} -c listen_addresses=127.0.0.1 -c fsync=on -c max_connections=200"
    subprocess.run([*run, str(bin_dir / "pg_ctl"), "-D", str(data), "-o", opts, "-w",
                    "-l", str(tmp / "pg.log"), "start"], check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    try:
        yield Postgres(f"postgresql://bench@127.0.0.1:{port}/postgres", data)
    finally:
        subprocess.run([*run, str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "stop"],
                       check=False, stdout=subprocess.DEVNULL)  # fmt: skip
        shutil.rmtree(tmp, ignore_errors=True)
