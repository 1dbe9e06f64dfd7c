"""A role that `up` started stops when `up` is gone, even when `up` itself was SIGKILLed.

`up` starts each role in a session of its own (so Ctrl-C and SIGTERM reach a role's whole
process group through `up`, never twice) with a pipe on its standard input that nothing is ever
written to. The pipe closes when `up` exits, however it exits; the role reads it in a thread,
and on end-of-file stops itself the way `up` would have (SIGTERM, then SIGKILL to its group
after a grace period). Without it, a SIGKILLed `up` left its roles running on their own.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

WATCH_ENV = "APPROVAL_BROKER_EXIT_WITH_UP"
"""Set to 1 by `up` in each role's environment; the role then watches its standard input."""

GRACE_S = 10.0
"""How long a role has to stop after SIGTERM before its process group is killed."""


def watch_for_up_exit() -> None:
    """When started by `up`, stop this process once `up` has exited; otherwise do nothing."""
    if os.environ.get(WATCH_ENV) != "1":
        return
    threading.Thread(target=_wait_for_eof, name="exit-with-up", daemon=True).start()


def _wait_for_eof() -> None:
    # the raw descriptor, not `sys.stdin.buffer`: a daemon thread blocked in a buffered read
    # holds the buffer's lock, and the interpreter's shutdown then aborts on it ("Fatal Python
    # error: _enter_buffered_busy") after every normal stop
    try:
        while os.read(sys.stdin.fileno(), 4096):
            pass  # `up` writes nothing; anything read is ignored
    except (OSError, ValueError):
        pass  # stdin closed or unusable: `up` is gone all the same
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(GRACE_S)  # a daemon thread: the process is normally gone before this ends
    os.killpg(os.getpgrp(), signal.SIGKILL)
