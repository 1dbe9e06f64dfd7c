"""An `approval-broker worker` subprocess a test can start, read and kill."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.support.waiting import wait_for

READY = "worker ready on queue agent-runs"


class WorkerProcess:
    """`approval-broker worker` as a child process with its own log file."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.log = log
        cli = Path(sys.executable).parent / "approval-broker"
        with log.open("a") as out:
            self.process = subprocess.Popen(
                [str(cli), "worker", "--no-resumer"],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_ready(self, seen: int = 0) -> None:
        wait_for(lambda: self.log.read_text().count(READY) > seen, timeout=90)

    def kill(self) -> None:
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGINT)  # stop taking jobs; runs in flight end
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.kill()
