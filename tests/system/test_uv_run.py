"""`uv run` in the checkout says nothing of its own: no "Bytecode compiled N files" each time
(what `[tool.uv] compile-bytecode = true` made it do); `.ci/run` compiles once instead."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_uv_run_in_the_checkout_prints_nothing_of_its_own() -> None:
    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not on PATH")
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "UV_COMPILE_BYTECODE")}
    done = subprocess.run(
        [uv, "run", "--frozen", "python", "-c", "print('ok')"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (done.stdout, done.stderr) == ("ok\n", "")


def test_ci_compiles_the_bytecode_once_before_the_suite() -> None:
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert lines.index("uv sync --compile-bytecode") < lines.index("uv run pytest")
