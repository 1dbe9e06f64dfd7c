"""Bring docs/architecture.md's module map up to date with the tree: line counts, new and gone modules.

    uv run python tools/module_map.py [--check]

Each `**package/**` heading is followed by a table of module rows (name, lines, what it owns). The
line counts are rewritten from `wc -l`; a module in the package that has no row, or a row
whose file is gone, is printed (a person writes what it owns). `--check` changes nothing and
exits 1 when anything is out of date. Tables without a lines column keep none.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "architecture.md"
HEADING = re.compile(r"^\*\*([\w/]+/)\*\*\s*$")
ROW = re.compile(r"^\| `([^`]+)` \|(?: (\d+) \|)?")
SOURCES = (".py", ".lua")


def lines_of(path: Path) -> int:
    return len(path.read_text().splitlines())


def update(text: str) -> tuple[str, list[str]]:
    """The page with fresh counts, and what a person must look at."""
    out: list[str] = []
    problems: list[str] = []
    package: Path | None = None
    listed: set[str] = set()

    def close() -> None:
        if package is None:
            return
        present = {
            p.name for p in package.iterdir() if p.suffix in SOURCES and p.name != "__init__.py"
        }
        for name in sorted(present - listed):
            problems.append(f"{package.relative_to(ROOT)}/{name}: no row in the module map")

    for line in text.splitlines():
        heading = HEADING.match(line)
        if heading or line.startswith(("#", "**")):  # a package's table ends at the next heading
            close()
            package, listed = (ROOT / heading.group(1), set()) if heading else (None, set())
        row = ROW.match(line) if package is not None else None
        if row and package is not None:
            name = row.group(1)
            path = package / name
            if not path.exists():  # `rules/store.py` under **broker/rules/**
                path = package.parent / name
            listed.add(path.name)
            if not path.exists():
                problems.append(f"{package.relative_to(ROOT)}/{name}: row for a file that is gone")
            elif row.group(2):
                line = line.replace(f"| {row.group(2)} |", f"| {lines_of(path)} |", 1)
        out.append(line)
    close()
    return "\n".join(out) + "\n", problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if stale")
    opts = parser.parse_args()
    old = PAGE.read_text()
    new, problems = update(old)
    for problem in problems:
        print(problem)
    if opts.check:
        if new != old:
            print("line counts are out of date")
        sys.exit(1 if problems or new != old else 0)
    PAGE.write_text(new)
    print(f"{PAGE.relative_to(ROOT)}: counts updated; {len(problems)} to look at")


if __name__ == "__main__":
    main()
