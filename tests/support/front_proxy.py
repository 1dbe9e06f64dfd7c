"""Debian's nginx running `deploy/nginx/approval-broker.conf.template`, as the compose file runs
it, in front of an API: the template's `${APPROVAL_BROKER_...}` names filled in the way the
official nginx image fills them (only those names: nginx's own `$variables` stay), inside a
minimal main config of the test's own (temp paths, pid and log in the test's folder)."""

from __future__ import annotations

import os
import re
import socket
import string
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from broker.redis.embedded import free_port
from tests.support.proc import stop_process
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "deploy" / "nginx" / "approval-broker.conf.template"
NAMES = ("APPROVAL_BROKER_API", "APPROVAL_BROKER_FRONT_PORT")


def rendered(values: dict[str, str]) -> str:
    """The template with `values` (every one of `NAMES`) put in, as envsubst would."""
    assert set(values) == set(NAMES)
    text = string.Template(TEMPLATE.read_text()).safe_substitute(values)
    left = re.findall(r"\$\{?APPROVAL_BROKER_\w+", text)
    assert not left, f"the template names what the front isn't given: {left}"
    return text


def main_config(folder: Path, server_block: Path) -> str:
    temp = {p: folder / p for p in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")}
    for path in temp.values():
        path.mkdir(exist_ok=True)
    user = "user root;\n" if os.geteuid() == 0 else ""  # workers may use the test's folders
    return (
        f"{user}daemon off;\nworker_processes 1;\npid {folder / 'nginx.pid'};\n"
        f"error_log {folder / 'error.log'} warn;\n"
        "events { worker_connections 1024; }\n"
        "http {\n  access_log off;\n"
        + "".join(f"  {name}_temp_path {path};\n" for name, path in temp.items())
        + f"  include {server_block};\n}}\n"
    )


def accepting(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


@contextmanager
def nginx_front(nginx: str, api_url: str, folder: Path) -> Iterator[str]:
    """nginx in front of the API at `api_url` (http://host:port); yields the front's URL."""
    port = free_port()
    folder.mkdir(parents=True, exist_ok=True)
    server_block = folder / "approval-broker.conf"
    upstream = api_url.removeprefix("http://")
    server_block.write_text(
        rendered({"APPROVAL_BROKER_API": upstream, "APPROVAL_BROKER_FRONT_PORT": str(port)})
    )
    config = folder / "nginx.conf"
    config.write_text(main_config(folder, server_block))
    check = subprocess.run(
        [nginx, "-t", "-q", "-c", str(config), "-p", str(folder)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0, check.stderr
    proc = subprocess.Popen(
        [nginx, "-c", str(config), "-p", str(folder)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: accepting(port) or proc.poll() is not None, timeout=30)
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process(proc)  # nginx: SIGTERM is a fast shutdown
