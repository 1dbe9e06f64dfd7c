"""No `async def` in the API calls the sync broker, the sync Redis client or a sync HTTP client.

Read with `ast`: inside every `async def` of `api/`, a call that is not awaited must not reach
the broker (`state.broker...`, the judge's sync face `state.judge...`), the sync Redis client
(`....redis.<command>` outside `state.reads()`, the core's asyncio reads), `httpx`'s sync functions, or one of our
own sync functions in `api/` that reach any of these (found by following their bodies). Such
work goes through `run_in_threadpool(...)` (the callable is passed, not called) or an async
client. A Redis that stalls then holds a worker thread for its socket timeout, never the loop.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted((ROOT / "api").rglob("*.py"))
IN_MEMORY = (
    "state.config",
    "state.settings",
    "state.metrics",
    "state.reads",
    "state.broker.keys",
    "state.broker.partitions",
    "state.broker.async_reads",
    "state.broker.config",
)
"""Parts of the app state that are memory only (or the async reads, and what makes them)."""
CLIENT_SET_UP = ("get_default_node", "get_nodes", "get_connection_kwargs")
"""Calls on a Redis client that read its own settings, never Redis."""
SYNC_HTTP = (
    "httpx.get",
    "httpx.post",
    "httpx.put",
    "httpx.delete",
    "httpx.request",
    "httpx.Client",
)


def direct(callee: str) -> str | None:
    """Why calling `callee` blocks (None: it doesn't, as far as its name tells)."""
    if callee.startswith(IN_MEMORY) or callee.endswith(CLIENT_SET_UP):
        return None
    if callee.startswith(("state.broker", "state.judge")):
        return "the sync broker"
    if ".redis." in f".{callee}" and not callee.startswith(("self.redis.", "redis.")):
        return "the sync Redis client"  # (self.redis, redis: the API's async clients)
    if callee.startswith(SYNC_HTTP):
        return "a sync HTTP call"
    return None


def calls(fn: ast.AST) -> list[ast.Call]:
    return [n for n in ast.walk(fn) if isinstance(n, ast.Call)]


def blocking_helpers(trees: list[ast.Module]) -> frozenset[str]:
    """Names of our sync functions in `api/` that reach the broker, sync Redis or sync HTTP,
    directly or through one another (a fixpoint over their bodies)."""
    sync_defs = [n for t in trees for n in ast.walk(t) if isinstance(n, ast.FunctionDef)]
    found: set[str] = set()
    grew = True
    while grew:
        grew = False
        for fn in sync_defs:
            if fn.name in found:
                continue
            for call in calls(fn):
                callee = ast.unparse(call.func)
                if direct(callee) or callee.rsplit(".", 1)[-1] in found:
                    found.add(fn.name)
                    grew = True
                    break
    return frozenset(found)


def blocking_calls(name: str, tree: ast.Module, helpers: frozenset[str]) -> list[str]:
    found: list[str] = []
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.AsyncFunctionDef):
            continue
        awaited = {id(n.value) for n in ast.walk(fn) if isinstance(n, ast.Await)}
        for node in calls(fn):
            if id(node) in awaited:
                continue
            callee = ast.unparse(node.func)
            why = direct(callee)
            if why is None and callee.rsplit(".", 1)[-1] in helpers:
                why = "our sync helper that reaches Redis"
            if why:
                found.append(f"{name}:{node.lineno}: {fn.name} calls {callee}(...) ({why})")
    return found


TREES = {p: ast.parse(p.read_text()) for p in FILES}
HELPERS = blocking_helpers(list(TREES.values()))


@pytest.mark.parametrize("path", FILES, ids=[p.relative_to(ROOT).as_posix() for p in FILES])
def test_no_async_route_or_stream_blocks_the_event_loop(path: Path) -> None:
    name = path.relative_to(ROOT).as_posix()
    assert blocking_calls(name, TREES[path], HELPERS) == []


def test_the_guard_sees_a_blocking_call() -> None:
    sample = """
def visible_request(state, rid):
    return state.broker.get_request(rid)

async def create(state, body):
    a = state.broker.create_request(body)
    b = await run_in_threadpool(state.broker.create_request, body)
    c = visible_request(state, "x")
    d = await run_in_threadpool(visible_request, state, "x")
    e = httpx.get("http://x")
    state.broker.redis.ping()
"""
    tree = ast.parse(sample)
    found = blocking_calls("api/sample.py", tree, blocking_helpers([tree]))
    assert [line.split(": ", 1)[1].split(" (")[0] for line in found] == [
        "create calls state.broker.create_request(...)",
        "create calls visible_request(...)",
        "create calls httpx.get(...)",
        "create calls state.broker.redis.ping(...)",
    ]
