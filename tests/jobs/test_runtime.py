"""The job-side runtime as a package of its own: a project pins one build, every job runs
that build beside its trainer archive, the host refuses a protocol it does not speak, and
a change to the platform's library re-versions nothing while adopting another runtime
re-versions exactly the models that pin it."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import zipline_runtime

from tests.conftest import BIN, TRAINERS
from tests.helpers import days_ending, local, write_table
from tests.support.training import DS, TABLE, make_model, resources
from tests.support.training import materialize as support_materialize
from zipline_dagster import Model
from zipline_dagster.jobs.archive import publish_trainer_archive
from zipline_dagster.jobs.runtime import RuntimeShipError, ship_runtime, store_runtime
from zipline_dagster.packaging import RuntimeArchive, build_runtime_archive
from zipline_dagster.storage.paths import runtime_uri

PROJECT = TRAINERS.parent
RUNTIME_SOURCE = PROJECT / "runtime" / "zipline_runtime"


def runtime_copy(tmp_path: Path, *, version: str = "", protocol: int | None = None) -> Path:
    """A copy of the repository's runtime package, its declared version or protocol
    changed (so a build of it differs from the installed one)."""
    dst = tmp_path / "rt" / "zipline_runtime"
    shutil.copytree(RUNTIME_SOURCE, dst, ignore=shutil.ignore_patterns("__pycache__"))
    init = dst / "__init__.py"
    text = init.read_text()
    if version:
        text = text.replace(
            f'__version__ = "{zipline_runtime.__version__}"', f'__version__ = "{version}"'
        )
    if protocol is not None:
        text = text.replace("PROTOCOL_VERSION = 1", f"PROTOCOL_VERSION = {protocol}")
    init.write_text(text + "# a build of its own\n")
    return dst


def ctr_model(version: str, base: str, runtime_version: str) -> Model:
    return dataclasses.replace(make_model(version, base), runtime_version=runtime_version)


def materialize(model: Model, base: str, ray_address: str | None) -> dg.ExecuteInProcessResult:
    return support_materialize(model, resources(ray_address, base), raise_on_error=False)


def pinned_build(tmp_path: Path, base: str, **changes: Any) -> RuntimeArchive:
    archive = build_runtime_archive(runtime_copy(tmp_path, **changes))
    store_runtime(base, archive)
    return archive


def test_a_job_runs_the_runtime_build_its_model_pins(
    launcher: str | None, file_base: str, trainer_copy: Path, tmp_path: Path
) -> None:
    """Not the runtime installed beside the platform (which the Ray head's and the local
    launcher's environments also hold): the report, written by the trainer through the
    runtime, names the pinned build's version; the manifest and the metadata name its
    content address."""
    write_table(file_base, TABLE, days_ending(DS, 4), rows=200)
    trainer = publish_trainer_archive(trainer_copy, model_name="listing_ctr_model", base=file_base)
    runtime = pinned_build(tmp_path, file_base, version="0.1.0+pinned")
    result = materialize(
        ctr_model(trainer.version, file_base, runtime.version), file_base, launcher
    )
    assert result.success
    (event,) = result.get_asset_materialization_events()
    md = {k: v.value for k, v in event.materialization.metadata.items()}  # type: ignore[union-attr]
    assert md["runtime_version"] == runtime.version
    assert md["report"]["runtime"] == {"version": "0.1.0+pinned", "protocol": 1}
    model_dir = local(f"{file_base}/models/listing_ctr_model/{trainer.version}/{DS}")
    manifest = json.loads((model_dir / "_MANIFEST.json").read_text())
    assert manifest["runtime_version"] == runtime.version
    assert f"`{runtime.version}`" in (model_dir / "card.md").read_text()


def test_a_runtime_of_a_protocol_the_host_does_not_speak_is_refused_before_any_job(
    file_base: str, trainer_copy: Path, tmp_path: Path
) -> None:
    write_table(file_base, TABLE, days_ending(DS, 4), rows=200)
    trainer = publish_trainer_archive(trainer_copy, model_name="listing_ctr_model", base=file_base)
    older = pinned_build(tmp_path, file_base, version="0.0.9", protocol=0)
    result = materialize(ctr_model(trainer.version, file_base, older.version), file_base, None)
    assert not result.success
    (failure,) = result.get_step_failure_events()
    text = failure.step_failure_data.error.message  # type: ignore[union-attr]
    assert f"runtime {older.version} (zipline-runtime 0.0.9, at " in text
    assert "speaks protocol 0; this platform speaks protocol 1" in text
    assert "zipline-dagster adopt-runtime" in text
    # nothing was submitted: no attempt folder of the partition exists
    partition = local(f"{file_base}/models/listing_ctr_model/{trainer.version}/{DS}")
    assert not partition.exists()


def test_a_pinned_runtime_missing_or_altered_in_storage_is_named(
    file_base: str, tmp_path: Path
) -> None:
    other = build_runtime_archive(runtime_copy(tmp_path, version="0.1.0+elsewhere"))
    with pytest.raises(RuntimeShipError) as missing:
        ship_runtime(file_base, other.version)
    uri = runtime_uri(file_base, other.version)
    said = str(missing.value)
    assert f"runtime {other.version} is pinned, but no build of it is at {uri}" in said
    assert "zipline-dagster adopt-runtime" in said
    store_runtime(file_base, other)
    local(uri).write_bytes(local(uri).read_bytes() + b"\0")
    with pytest.raises(RuntimeShipError, match=rf"runtime at {uri} does not match its version"):
        ship_runtime(file_base, other.version)


def project_copy(tmp_path: Path) -> Path:
    """The project's library, code location, trainers and lock, as a checkout holds them."""
    dst = tmp_path / "proj"
    dst.mkdir()
    ignore = shutil.ignore_patterns("__pycache__")
    for folder in ("zipline_dagster", "trainers"):
        shutil.copytree(PROJECT / folder, dst / folder, ignore=ignore)
    for name in ("trainers.lock", "pyproject.toml"):
        shutil.copy2(PROJECT / name, dst / name)
    return dst


#: What the code location says of itself: every asset's code version and where the
#: library it ran came from; and what every trainer of the project builds to.
VERSIONS = """
import json, sys
from pathlib import Path
import zipline_dagster
from zipline_dagster.defs import defs
from zipline_dagster.jobs.archive import build_trainer_archive
graph = defs.resolve_asset_graph()
print(json.dumps({
    "library": zipline_dagster.__file__,
    "code_versions": {k.to_user_string(): graph.get(k).code_version
                      for k in graph.get_all_asset_keys()},
    "trainers": {p.name: build_trainer_archive(p).version
                 for p in sorted(Path("trainers").iterdir()) if (p / "setup.py").is_file()},
}))
"""


def versions_of(project: Path, env: dict[str, str]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", VERSIONS],
        cwd=project,
        env={**os.environ, **env, "PYTHONPATH": str(project)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def cli(project: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "zipline-dagster"), *args],
        cwd=project,
        env={**os.environ, **env, "PYTHONPATH": str(project)},
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture
def project(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    env = {"ZIPLINE_HOME": str(tmp_path / "home"), "DAGSTER_HOME": ""}
    return project_copy(tmp_path), env


@pytest.mark.slow
def test_a_changed_library_changes_no_version_pin_or_staleness(
    project: tuple[Path, dict[str, str]],
) -> None:
    """An upgrade of zipline_dagster alone (here: a comment appended to every module of
    the library, the code location's included) leaves every trainer's version, the lock,
    `check` and every asset's code version (so Dagster's staleness) as they were."""
    root, env = project
    before = versions_of(root, env)
    lock = (root / "trainers.lock").read_bytes()
    touched = 0
    for module in (root / "zipline_dagster").rglob("*.py"):
        module.write_text(module.read_text() + "\n# upgraded\n")
        touched += 1
    after = versions_of(root, env)
    assert touched > 90 and after["library"].startswith(str(root))
    assert after["trainers"] == before["trainers"] and len(after["trainers"]) == 3
    assert after["code_versions"] == before["code_versions"]
    checked = cli(root, env, "check")
    assert checked.returncode == 0, checked.stderr
    assert "every trainer in the project builds to its pin" in checked.stdout
    assert (root / "trainers.lock").read_bytes() == lock


@pytest.mark.slow
def test_adopting_another_runtime_reversions_exactly_the_models_that_pin_it(
    project: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    root, env = project
    before = versions_of(root, env)
    changed = runtime_copy(tmp_path)  # the same protocol, other bytes
    adopted = cli(root, env, "adopt-runtime", "--source", str(changed))
    assert adopted.returncode == 0, adopted.stderr
    new = build_runtime_archive(changed).version
    installed = zipline_runtime.__version__
    assert f"pinned runtime {new} (zipline-runtime {installed}, protocol 1)" in adopted.stdout
    assert "re-versions 2 model(s): listing_ctr_model, listing_price_model" in adopted.stdout
    assert json.loads((root / "trainers.lock").read_text())["runtime"]["version"] == new
    assert local(runtime_uri((tmp_path / "home" / "warehouse").as_uri(), new)).is_file()
    after = versions_of(root, env)
    assert after["trainers"] == before["trainers"]
    moved = {k for k, v in after["code_versions"].items() if v != before["code_versions"][k]}
    # the models, and what their code versions carry: their scores
    assert moved == {
        "models/listing_ctr_model",
        "models/listing_price_model",
        "ctr/listing_ctr_model_scores",
        "ctr/listing_price_model_scores",
    }
    assert all(after["code_versions"][k].endswith(new) for k in moved if k.startswith("models/"))
    again = cli(root, env, "adopt-runtime", "--source", str(changed))
    assert again.returncode == 0 and "nothing changes" in again.stdout
    refused = cli(
        root, env, "adopt-runtime", "--source", str(runtime_copy(tmp_path / "p0", protocol=0))
    )
    assert refused.returncode == 1
    assert "speaks protocol 0; this platform speaks protocol 1" in refused.stderr
    assert json.loads((root / "trainers.lock").read_text())["runtime"]["version"] == new
