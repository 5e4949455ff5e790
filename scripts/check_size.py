"""The library's structure bar, checked by ``make lint``: every function at most cyclomatic
complexity 15 (radon's count), nested functions (closures) and methods included, every
module at most 500 lines.

Usage: ``python scripts/check_size.py [PATH ...]`` (default: ``zipline_dagster``). Prints
each function or module over its bar, with its number and the bar, and exits 1 when there
is one; exits 0 silently otherwise."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from radon.complexity import cc_visit

MAX_COMPLEXITY = 15
MAX_LINES = 500


def problems(paths: list[Path]) -> list[str]:
    """Every function above ``MAX_COMPLEXITY`` and module above ``MAX_LINES``, as lines."""
    found = []
    files = [p for root in paths for p in (root.rglob("*.py") if root.is_dir() else [root])]
    for path in sorted(files):
        source = path.read_text()
        lines = len(source.splitlines())
        if lines > MAX_LINES:
            found.append(f"{path}: {lines} lines (at most {MAX_LINES})")
        for item in functions(cc_visit(source)):
            if item.complexity > MAX_COMPLEXITY:
                found.append(
                    f"{path}:{item.lineno}: {item.fullname} has cyclomatic complexity "
                    f"{item.complexity} (at most {MAX_COMPLEXITY})"
                )
    return found


def functions(blocks: list[Any]) -> Iterator[Any]:
    """Every function of radon's ``blocks``, each closure and method of it too, at any
    depth (radon counts a closure apart from the function around it; a class's own
    number is its methods' sum, not a function's)."""
    for item in blocks:
        if hasattr(item, "methods"):  # a class: its methods (and their closures)
            yield from functions(item.methods)
            continue
        yield item
        yield from functions(item.closures)


def main(argv: list[str]) -> int:
    found = problems([Path(a) for a in argv] or [Path("zipline_dagster")])
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
