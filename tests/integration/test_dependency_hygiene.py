"""Production code uses its dependencies through their public APIs only, and layers one way.

Read with `ast` (nothing imported or run), over every module of the production packages:

- no private module or name of a dependency is imported (`from x._y`, `import x._y`,
  `from x import _y`), nor an internal package (`uvicorn.protocols`, `redis._parsers`, RQ
  modules outside its documented API);
- no private attribute is used that our own code doesn't define (`pool._connections`,
  `Webhook(secret)._whsecret`, or spelled as a string: `getattr(agent, "_output_validators")`):
  an underscore name we never assign or define can only be a dependency's; the one read
  allowed, with its reason, is in `ALLOWED_PRIVATE_READS`;
- no class derives from a dependency's internal class, or overrides a private method of a
  dependency's class;
- no raw socket or hand-made client for a protocol a dependency speaks (`socket.socket`,
  `socket.create_connection`, `asyncio.open_connection`, `http.client`), except the few
  allowed below, each with its reason;

and the package layering (import-linter contracts in pyproject.toml: `api`, `workers`,
`notifiers` import `broker`, never the reverse; `broker` imports no web framework, Slack SDK or
RQ worker code) holds, checked by running `lint-imports`.
"""

from __future__ import annotations

import ast
import importlib
import shutil
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (
    "broker",
    "api",
    "notifiers",
    "workers",
    "approval_broker",
    "mcp_gateway",
    "clients/python/approval_broker_client",
    "examples/refunds_demo",
)
OURS = {*PACKAGES, "tests", "bench", "clients", "approval_broker_client", "refunds_demo"}

INTERNAL_MODULES = ("uvicorn.protocols", "uvicorn.lifespan", "uvicorn.loops", "redis._parsers")
RQ_PUBLIC = {
    "rq",
    "rq.job",
    "rq.queue",
    "rq.worker",
    "rq.registry",
    "rq.serializers",
    "rq.exceptions",
    "rq.command",
    "rq.decorators",
    "rq.retry",
    "rq.results",
    "rq.group",
    "rq.timeouts",
    "rq.suspension",
    "rq.worker_pool",
    "rq.cron",
    "rq.scheduler",
}
"""RQ modules its documentation names (python-rq.org: jobs, queues, workers, registries,
results, exceptions, serializers, retries, groups, cron, and the scheduler a worker runs with
`--with-scheduler`, `RQScheduler`); `rq.utils` and the rest are internal."""

DOCUMENTED_UNDERSCORE = {
    "_exit",  # os._exit: documented
    "_getframe",  # sys._getframe: documented
    "_asdict",  # namedtuple's public API
    "_replace",
    "_fields",
    "_make",
    "_missing_",  # enum's documented hooks
    "_generate_next_value_",
    "_value_",
    "_name_",
}

RAW_SOCKET_CALLS = {
    ("socket", "socket"),
    ("socket", "create_connection"),
    ("socket", "socketpair"),
    ("asyncio", "open_connection"),
    ("asyncio", "open_unix_connection"),
    ("loop", "create_connection"),
    ("loop", "sock_connect"),
}
ALLOWED_RAW_SOCKETS = {
    "approval_broker/up.py": "binds the API's port to see it is free (SO_REUSEADDR, as uvicorn "
    "binds it); speaks no protocol",
    "broker/redis/embedded.py": "asks the kernel for a free port for an embedded redis-server "
    "(bind to port 0, close); speaks no protocol",
    "broker/redis/cluster_node.py": "finds a free port pair (node and cluster bus) for a local "
    "cluster node (bind, close); speaks no protocol",
}
ALLOWED_PRIVATE_READS = {
    ("broker/runs/agents.py", "_output_validators"): "pydantic-ai refuses a run-time "
    "`output_type` for an agent with output validators and offers no public way to ask whether "
    "it has any; read once per registration or load (`getattr` with a default, so a rename "
    "turns the early check off, never a run), so that an agent that can never pause is refused "
    "before any run starts",
}
"""(file, name) -> why: a dependency's private name our code reads on purpose, each with its
reason (`test_every_allowed_private_read_is_still_there` drops stale ones)."""
REFLECTION = {"getattr", "hasattr", "setattr", "delattr"}
HAND_MADE_CLIENTS = {"HTTPConnection", "HTTPSConnection", "HTTPResponse"}
"""`http.client`'s connection classes: an HTTP client by hand (httpx is the one HTTP client).
Naming `http.client.HTTPException` to catch it is not one."""


def production_files() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@cache
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def third_party(module: str) -> bool:
    top = module.split(".")[0]
    return bool(top) and top not in OURS and top not in sys.stdlib_module_names


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


@cache
def our_names() -> frozenset[str]:
    """Every underscore name our production code defines: functions, classes, assignments,
    attributes it sets, parameters, class fields."""
    names: set[str] = set()
    for path in production_files():
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store | ast.Del):
                names.add(node.attr)
            elif isinstance(node, ast.alias):
                names.add((node.asname or node.name).split(".")[0])
    return frozenset(n for n in names if private(n))


def imported_names(tree: ast.Module) -> dict[str, str]:
    """Local name -> the third-party module (or module.name) it was imported from."""
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if third_party(alias.name):
                    found[alias.asname or alias.name.split(".")[0]] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if third_party(node.module):
                for alias in node.names:
                    found[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return found


def internal_module(module: str) -> str | None:
    """Why importing `module` reaches into a dependency's internals (None: it doesn't)."""
    if not third_party(module):
        return None
    if any(private(part) for part in module.split(".")):
        return "a private module"
    if any(module == m or module.startswith(m + ".") for m in INTERNAL_MODULES):
        return "an internal package"
    if module.split(".")[0] == "rq" and ".".join(module.split(".")[:2]) not in RQ_PUBLIC:
        return "an RQ module outside its documented API"
    return None


def import_violations(name: str, tree: ast.Module) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                why = internal_module(alias.name)
                if why:
                    yield f"{name}:{node.lineno}: import {alias.name} ({why})"
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            why = internal_module(node.module)
            if why:
                yield f"{name}:{node.lineno}: from {node.module} import ... ({why})"
            if node.module == "http.client":
                for alias in node.names:
                    if alias.name in HAND_MADE_CLIENTS:
                        yield f"{name}:{node.lineno}: http.client.{alias.name} (a hand-made client)"
            if third_party(node.module):
                for alias in node.names:
                    if private(alias.name):
                        yield f"{name}:{node.lineno}: from {node.module} import {alias.name}"


def reflected_name(node: ast.AST) -> str | None:
    """The attribute `getattr(x, "name")` (or hasattr, setattr, delattr) reaches, if literal."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) >= 2:
        if node.func.id in REFLECTION:
            spelled = node.args[1]
            if isinstance(spelled, ast.Constant) and isinstance(spelled.value, str):
                return spelled.value
    return None


def attribute_violations(name: str, tree: ast.Module) -> Iterator[str]:
    ours = our_names()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            attr: str | None = node.attr
        else:
            attr = reflected_name(node)
        if attr is None or not private(attr) or attr in ours or attr in DOCUMENTED_UNDERSCORE:
            continue
        if (name, attr) not in ALLOWED_PRIVATE_READS:
            yield f"{name}:{getattr(node, 'lineno', 0)}: .{attr} (a dependency's private name)"


def defines(dotted: str, attribute: str) -> bool:
    """Whether the dependency's class `dotted` (module.Class) has `attribute` (imported to see;
    a class that can't be imported counts as having it: the check stays strict)."""
    module, _, qualname = dotted.rpartition(".")
    try:
        found: object = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        return True
    return hasattr(found, attribute)


def subclass_violations(name: str, tree: ast.Module) -> Iterator[str]:
    theirs = imported_names(tree)
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        bases = [ast.unparse(b) for b in node.bases]
        dependency_bases = []
        for base in bases:
            head = base.split(".")[0]
            origin = theirs.get(head)
            if origin is None:
                continue
            full = origin + base[len(head) :]
            dependency_bases.append(full)
            module = full.rsplit(".", 1)[0]
            if internal_module(module) or any(private(p) for p in full.split(".")):
                yield f"{name}:{node.lineno}: class {node.name}({base}): a dependency's internals"
        if dependency_bases:
            for item in node.body:
                if (
                    isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                    and private(item.name)
                    and any(defines(base, item.name) for base in dependency_bases)
                ):
                    yield (
                        f"{name}:{item.lineno}: {node.name}.{item.name} overrides a private "
                        f"method of {', '.join(dependency_bases)}"
                    )


def socket_violations(name: str, tree: ast.Module) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in HAND_MADE_CLIENTS:
            if ast.unparse(node.value) == "http.client":
                yield f"{name}:{node.lineno}: http.client.{node.attr} (a hand-made client)"
    if name in ALLOWED_RAW_SOCKETS:
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            held = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", "")
            if (held, node.func.attr) in RAW_SOCKET_CALLS:
                yield f"{name}:{node.lineno}: {held}.{node.func.attr}(...) (a raw socket)"


FILES = production_files()
IDS = [rel(p) for p in FILES]


@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_no_private_or_internal_module_of_a_dependency_is_imported(path: Path) -> None:
    assert list(import_violations(rel(path), parsed(path))) == []


@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_no_private_attribute_of_a_dependency_is_used(path: Path) -> None:
    assert list(attribute_violations(rel(path), parsed(path))) == []


@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_no_class_derives_from_or_overrides_a_dependencys_internals(path: Path) -> None:
    assert list(subclass_violations(rel(path), parsed(path))) == []


@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_no_raw_socket_speaks_a_protocol_a_dependency_speaks(path: Path) -> None:
    assert list(socket_violations(rel(path), parsed(path))) == []


def test_every_allowed_raw_socket_is_still_there() -> None:
    """An allowance outlives its reason only by mistake: each names a file that opens one."""
    for name in ALLOWED_RAW_SOCKETS:
        tree = parsed(ROOT / name)
        calls = [
            n
            for n in ast.walk(tree)
            if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute)
            and n.func.attr in {"socket", "create_connection"}
        ]
        assert calls, f"{name} opens no socket any more: drop its allowance"


def test_every_allowed_private_read_is_still_there() -> None:
    """An allowance outlives its reason only by mistake: each names a read its file still has."""
    for name, attr in ALLOWED_PRIVATE_READS:
        tree = parsed(ROOT / name)
        reads = [
            n
            for n in ast.walk(tree)
            if (isinstance(n, ast.Attribute) and n.attr == attr) or reflected_name(n) == attr
        ]
        assert reads, f"{name} no longer reads {attr}: drop its allowance"


SAMPLE = """
import uvicorn.protocols.http.httptools_impl
from redis._parsers.base import _AsyncRESPBase
from rq.utils import now
from redis.cluster import RedisCluster
import socket
import http.client

class Mine(RedisCluster):
    def _internal_execute_command(self): ...

def f(pool):
    socket.socket()
    http.client.HTTPConnection("example.org")
    return pool._available_connections, getattr(pool, "_created_connections", 0)
"""


def test_the_checks_see_what_they_must() -> None:
    """The guard itself can fail: a module doing each forbidden thing is caught by each check."""
    name, tree = "broker/sample.py", ast.parse(SAMPLE)
    found = [
        *import_violations(name, tree),
        *attribute_violations(name, tree),
        *subclass_violations(name, tree),
        *socket_violations(name, tree),
    ]
    text = "\n".join(found)
    for expected in (
        "uvicorn.protocols",
        "redis._parsers",
        "_AsyncRESPBase",
        "rq.utils",
        "._available_connections",
        "._created_connections",
        "Mine._internal_execute_command",
        "socket.socket",
        "http.client.HTTPConnection",
    ):
        assert expected in text, text


RQ_WORKER_CODE = {"rq.worker", "rq.worker_pool", "rq.Worker", "rq.SimpleWorker", "rq.WorkerPool"}


def rq_worker_imports(name: str, tree: ast.Module) -> Iterator[str]:
    """RQ's worker code imported (import-linter can't forbid an external package's submodule)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            hits = [a.name for a in node.names if a.name in RQ_WORKER_CODE]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            hits = [node.module] if node.module in RQ_WORKER_CODE else []
            hits += [f"{node.module}.{a.name}" for a in node.names]
            hits = [h for h in hits if h in RQ_WORKER_CODE]
        else:
            continue
        for hit in hits:
            yield f"{name}:{node.lineno}: {hit} (RQ worker code)"


BROKER_FILES = [p for p in FILES if rel(p).startswith("broker/")]


@pytest.mark.parametrize("path", BROKER_FILES, ids=[rel(p) for p in BROKER_FILES])
def test_broker_imports_no_rq_worker_code(path: Path) -> None:
    """DESIGN: the worker process is `workers/`; `broker/` enqueues and reads jobs only."""
    assert list(rq_worker_imports(rel(path), parsed(path))) == []


def test_the_rq_worker_check_sees_a_worker_import() -> None:
    tree = ast.parse("from rq import Queue, Worker\nimport rq.worker\n")
    assert len(list(rq_worker_imports("broker/sample.py", tree))) == 2


@pytest.mark.skipif(shutil.which("lint-imports") is None, reason="import-linter not installed")
def test_package_layering_holds() -> None:
    """import-linter's contracts in pyproject.toml (`[tool.importlinter]`)."""
    done = subprocess.run(
        ["lint-imports", "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
