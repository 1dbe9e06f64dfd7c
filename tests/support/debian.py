"""Programs from Debian's packages that some tests need (Chromium, nginx), installed on demand.

CI's machine is a fresh Debian with root: a test that needs a program installs its package the
first time, one install at a time (each xdist worker has its own session, and a second apt-get
while the first holds dpkg's lock fails with exit 100). Without root or apt-get the test skips
and says what is missing.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess

import pytest

INSTALL_LOCK = "/tmp/approval-broker-tests-apt.lock"


def _apt_install(package: str) -> None:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(
        ["apt-get", "update", "-qq"], check=True, env=env, capture_output=True, timeout=600
    )
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", package],
        check=True,
        env=env,
        capture_output=True,
        timeout=900,
    )


def which(program: str) -> str | None:
    """`program` on PATH or in the sbin folders a Debian package puts servers in."""
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    return shutil.which(program, path=path)


def debian_program(program: str, package: str) -> str:
    """The path of `program`, installing Debian's `package` first if needed (else skip)."""
    path = which(program)
    if path is None and os.geteuid() == 0 and shutil.which("apt-get"):
        with open(INSTALL_LOCK, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            path = which(program)  # another worker installed it meanwhile
            if path is None:
                _apt_install(package)
                path = which(program)
    if path is None:
        pytest.skip(f"Debian's {package} is not installed and cannot be installed without root")
    return path
