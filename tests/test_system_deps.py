"""scripts/system-deps, which `make test`, `make demo` and .ci/run call first: what it
refuses, by name, before anything is installed or run (the apt-get path itself runs in
CI on a machine that lacks the packages)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "system-deps"


def run(*needs: str, java_home: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    if java_home is not None:
        env["JAVA_HOME"] = str(java_home)
    return subprocess.run(
        [str(SCRIPT), *needs], env=env, capture_output=True, text=True, timeout=60
    )


def fake_java(home: Path, banner: str) -> Path:
    """A JAVA_HOME whose bin/java prints ``banner`` as `java -version` does (on stderr)."""
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text(f"#!/bin/sh\necho '{banner}' >&2\n")
    java.chmod(0o755)
    return home


@pytest.mark.parametrize(
    ("banner", "shown"),
    [
        ('openjdk version "11.0.2" 2019-01-15', "Java 11.0.2"),
        ('java version "1.8.0_402"', "Java 1.8.0_402"),
        ("no version here", "Java of unknown version"),
    ],
)
def test_a_java_older_than_17_is_refused_naming_it(tmp_path: Path, banner: str, shown: str) -> None:
    home = fake_java(tmp_path / "jdk", banner)
    res = run("java", java_home=home)
    assert res.returncode == 1
    assert (
        f"{home}/bin/java is {shown}; Spark 4 needs Java 17 or newer (openjdk-17-jre-headless)"
    ) in " ".join(res.stderr.split())


def test_java_17_or_newer_passes(tmp_path: Path) -> None:
    home = fake_java(tmp_path / "jdk", 'openjdk version "21.0.4" 2024-07-16')
    res = run("java", java_home=home)
    assert (res.returncode, res.stdout, res.stderr) == (0, "", "")


def test_a_java_home_without_java_is_refused(tmp_path: Path) -> None:
    res = run("java", java_home=tmp_path / "nothing")
    assert res.returncode == 1
    assert f"JAVA_HOME={tmp_path / 'nothing'} has no bin/java" in res.stderr


def test_an_unknown_need_is_refused() -> None:
    res = run("java", "rust")
    assert res.returncode == 2
    assert "unknown need 'rust'; expected java, chromium, npm or postgres" in res.stderr
