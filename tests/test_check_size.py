"""The structure bar of ``make lint`` (``scripts/check_size.py``): a function above
cyclomatic complexity 15 or a module above 500 lines is named with its number; the
library itself passes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

SCRIPT = ROOT / "scripts" / "check_size.py"


def run(*paths: Path | str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, paths)], capture_output=True, text=True, cwd=ROOT
    )


def test_a_complex_function_and_a_long_module_are_named(tmp_path: Path) -> None:
    branches = "\n".join(f"    if x == {i}:\n        return {i}" for i in range(15))
    (tmp_path / "complex.py").write_text(f"def pick(x):\n{branches}\n    return -1\n")
    (tmp_path / "simple.py").write_text("def one(x):\n    return x\n" + "\n" * 497)
    (tmp_path / "long.py").write_text("x = 1\n" * 501)
    done = run(tmp_path)
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert f"{tmp_path / 'complex.py'}:1: pick has cyclomatic complexity 16 (at most 15)" in lines
    assert f"{tmp_path / 'long.py'}: 501 lines (at most 500)" in lines
    assert not [line for line in lines if "simple.py" in line]  # 499 lines, complexity 1


def test_a_complex_closure_or_method_is_named_too(tmp_path: Path) -> None:
    """A nested function counts on its own (radon keeps a closure's branches out of the
    function around it): a factory whose closure is over the bar is named by it."""
    branches = "\n".join(f"        if x == {i}:\n            return {i}" for i in range(15))
    (tmp_path / "nested.py").write_text(
        f"def factory():\n    def inner(x):\n{branches}\n        return -1\n    return inner\n"
        f"class C:\n    def m(self):\n        def deep(x):\n{branches.replace('        ', '            ')}\n"
        "            return -1\n        return deep\n"
    )
    done = run(tmp_path)
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert f"{tmp_path / 'nested.py'}:2: inner has cyclomatic complexity 16 (at most 15)" in lines
    assert any(": deep has cyclomatic complexity 16" in line for line in lines), lines
    assert not any("factory" in line or " m has" in line for line in lines)


def test_the_library_and_the_runtime_are_within_the_bar() -> None:
    done = run("zipline_dagster", "runtime")
    assert done.returncode == 0, done.stdout
