"""A tiny upstream MCP server for the gateway's tests (FastMCP, stdio or Streamable HTTP).

Every tool run is appended as one JSON line to the file named by `--log`, so a test can say
how often, and with which args, the upstream really ran. `hang` never answers; `die` ends the
process mid-call.

    python tests/support/fakes/mcp_notes_server.py --log runs.jsonl [--http PORT]
"""

from __future__ import annotations

import argparse
import json
import os

import anyio
from mcp.server.fastmcp import FastMCP

parser = argparse.ArgumentParser()
parser.add_argument("--log", required=True)
parser.add_argument("--http", type=int, default=None)
options = parser.parse_args()

server = FastMCP("notes", host="127.0.0.1", port=options.http or 8000, stateless_http=True)


def ran(tool: str, **args: object) -> None:
    with open(options.log, "a") as log:
        log.write(json.dumps({"tool": tool, "args": args, "pid": os.getpid()}) + "\n")


@server.tool()
def read_note(name: str) -> str:
    """Read a note."""
    ran("read_note", name=name)
    return f"contents of {name}"


@server.tool()
def write_note(name: str, text: str) -> str:
    """Write a note."""
    ran("write_note", name=name, text=text)
    return f"wrote {len(text)} characters to {name}"


@server.tool()
def delete_note(name: str) -> str:
    """Delete a note."""
    ran("delete_note", name=name)
    return f"deleted {name}"


@server.tool()
def archive_note(name: str) -> str:
    """Archive a note (a policy rule allows it)."""
    ran("archive_note", name=name)
    return f"archived {name}"


@server.tool()
async def hang(seconds: float = 3600) -> str:
    """Never answers (in time); other calls are served meanwhile."""
    ran("hang", seconds=seconds)
    await anyio.sleep(seconds)
    return "woke up"


@server.tool()
def die() -> str:
    """Ends the server process in the middle of the call."""
    ran("die")
    os._exit(3)


if options.http is None:
    server.run("stdio")
else:
    server.run("streamable-http")
