"""What a config needs of the machine it runs on, checked before anything starts.

Parsing (`broker.domain.config`) checks a config against itself; these checks look at the
environment: every configured channel kind's extra is installed, and every agent's import path
imports. `config check` prints them; `up` refuses to start on any of them, so a run never
fails minutes later on what was knowable at start.

The agents are imported in a child interpreter started as the fleet starts a worker
(`python -m`, in the current folder), so the check sees the same `sys.path` a worker will (a
module beside the config imports there and not in this process), and the command that asks
loads neither pydantic-ai nor the user's code.
"""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import import_module

from broker.domain.config import Config
from channels import missing_extra

AGENT_CHECK_TIMEOUT_S = 120.0
"""How long importing the agents may take (a cold laptop imports pydantic-ai in a few s)."""


def start_problems(config: Config) -> list[str]:
    """Everything that would break once the fleet runs, one line each (empty: none)."""
    problems = []
    extra = missing_extra(config)
    if extra is not None:
        problems.append(extra)
    problems += agent_problems(config)
    return problems


def agent_problems(config: Config) -> list[str]:
    """Each agent whose path (or deps factory) doesn't import here, with the import's error."""
    paths = {
        f"agents.{name}.{key}": path
        for name, agent in sorted(config.agents.items())
        for key, path in (("path", agent.path), ("deps", agent.deps))
        if path is not None
    }
    if not paths:
        return []
    try:
        done = subprocess.run(
            [sys.executable, "-m", __name__, json.dumps(paths)],
            capture_output=True,
            text=True,
            timeout=AGENT_CHECK_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return [f"{config.source}: agents: importing them took over {AGENT_CHECK_TIMEOUT_S:g} s"]
    try:
        found: dict[str, str] = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return [f"{config.source}: agents: the import check failed ({last})"]
    return [f"{config.source}: {key}: {problem}" for key, problem in found.items()]


def import_problem(path: str, agent: bool) -> str | None:
    """Why `package.module:name` can't be used here, in one line; None when it imports."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        return f"{path!r} is not of the form 'package.module:name'"
    try:
        found: object = import_module(module_name)
    except Exception as exc:  # any error the user's module raises while importing is the answer
        return f"cannot import {module_name} ({type(exc).__name__}: {one_line(exc)})"
    for part in attr.split("."):
        if not hasattr(found, part):
            return f"{module_name} has no {attr}"
        found = getattr(found, part)
    if agent and not hasattr(found, "iter"):
        return f"{path} is not a pydantic-ai Agent"
    return None


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300] + ("..." if len(text) > 300 else "")


def main() -> None:
    """`python -m approval_broker.start_checks '{"agents.a.path": "pkg.mod:agent"}'`: print
    the problems as one JSON object (key: problem), on the last line (an import may print)."""
    paths: dict[str, str] = json.loads(sys.argv[1])
    problems = {}
    for key, path in paths.items():
        problem = import_problem(path, agent=key.endswith(".path"))
        if problem is not None:
            problems[key] = problem
    sys.stdout.write("\n" + json.dumps(problems) + "\n")


if __name__ == "__main__":
    main()
