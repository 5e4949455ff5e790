"""Pinned trainer versions cannot drift: a trainer edited without building it again is
named at load (a warning, and the model asset's description), by `zipline-dagster check`
and `build-trainer --check` (non-zero exits), a backfill that would train it is not
launched, and the model refuses to train; building it
records the new pin, and then all agree again. Run on a copy of a project: real CLI
processes, a real code location module, a real Dagster materialization."""

from __future__ import annotations

import json
import logging
import shutil
import textwrap
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from tests.conftest import ROOT, TRAINERS, run_cli
from zipline_dagster import ModelSpecError
from zipline_dagster.jobs.archive import build_trainer_archive
from zipline_dagster.jobs.pins import LOCK_NAME, find_drift, pinned_version

NAME = "listing_ctr_model"


def project(tmp_path: Path, base: str) -> Path:
    """A project: pyproject.toml, trainers/{NAME} and a code location module whose model
    reads its pin from trainers.lock."""
    root = tmp_path / "proj"
    shutil.copytree(
        TRAINERS / NAME, root / "trainers" / NAME, ignore=shutil.ignore_patterns("__pycache__")
    )
    (root / "pyproject.toml").write_text('[project]\nname = "proj"\n')
    (root / "proj_defs.py").write_text(
        textwrap.dedent(
            f"""
            import dataclasses
            from pathlib import Path
            from tests.training.test_assets import TABLE, make_model, resources
            from zipline_dagster.definitions import ExternalTable, build_definitions
            from zipline_dagster.jobs.pins import pinned_version

            model = make_model(pinned_version({NAME!r}, near=__file__), {base!r})
            defs = build_definitions(
                external_tables=[ExternalTable(TABLE)],
                models=[model],
                resources=resources(None, {base!r}),
                automation=False,
                trainers=Path(__file__).parent / "trainers",
            )
            """
        )
    )
    return root


@pytest.mark.slow
def test_a_trainer_edited_without_a_new_pin_is_named_everywhere_and_refuses_to_train(
    tmp_path: Path, file_base: str, caplog: pytest.LogCaptureFixture
) -> None:
    root = project(tmp_path, file_base)
    env = {"PYTHONPATH": f"{ROOT}:{root}"}
    source = root / "trainers" / NAME

    with pytest.raises(ModelSpecError, match="pins no trainer version for it; build its"):
        pinned_version(NAME, near=root / "proj_defs.py")
    built = run_cli("build-trainer", str(source), "--model-name", NAME, "--base", file_base)
    assert built.returncode == 0, built.stderr
    first = build_trainer_archive(source).version
    lock = json.loads((root / LOCK_NAME).read_text())
    assert lock["models"][NAME]["version"] == first
    assert lock["models"][NAME]["source"] == f"trainers/{NAME}"
    ok = run_cli("check", "--module", "proj_defs", env=env)
    assert ok.returncode == 0, ok.stderr
    assert "every trainer in the project builds to its pin" in ok.stdout

    # edited, not built again
    train = source / "trainer" / "train.py"
    train.write_text(train.read_text() + "\n# a new flag, say\n")
    second = build_trainer_archive(source).version
    said = (
        f"model '{NAME}' pins trainer version {first}, but its source {source} builds to "
        f"{second}: it would train the old archive. Run `zipline-dagster build-trainer "
        f"{source} --model-name {NAME} --base {file_base}`"
    )
    checked = run_cli("check", "--module", "proj_defs", env=env)
    assert checked.returncode == 1 and said in checked.stderr
    assert checked.stderr.count(said) == 1, checked.stderr  # said once, as the error it is
    pin_check = run_cli("build-trainer", str(source), "--model-name", NAME, "--check")
    assert pin_check.returncode == 1
    assert f"builds trainer version {second}, but" in pin_check.stderr

    # a backfill that would train it is refused before anything is launched
    home = tmp_path / "dagster_home"
    home.mkdir()
    backfill = run_cli(
        "backfill", NAME, "--start-ds", "2026-07-10", "--end-ds", "2026-07-11",
        "--module", "proj_defs", env={**env, "DAGSTER_HOME": str(home)},
    )  # fmt: skip
    assert backfill.returncode == 1, backfill.stderr
    assert f"error: nothing was launched: {said}" in backfill.stderr
    assert backfill.stderr.count(said) == 1, backfill.stderr
    assert "would refuse to train" in backfill.stderr and "backfill_id" not in backfill.stdout
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert instance.get_backfills() == [] and instance.get_runs() == []

    # at load: a warning in the log and on the asset's description in the UI
    import importlib
    import sys

    sys.path.insert(0, str(root))
    try:
        with caplog.at_level(logging.WARNING, logger="zipline_dagster"):
            module = importlib.import_module("proj_defs")
        defs: Any = module.defs
        model = module.model
    finally:
        sys.path.remove(str(root))
        sys.modules.pop("proj_defs", None)
    assert said in caplog.text
    node = defs.resolve_asset_graph().get(dg.AssetKey(["models", NAME]))
    assert node.description.startswith(f"WARNING: {said}")
    assert [d.built for d in find_drift([model], root / "trainers")] == [second]

    # and training refuses, before anything is read or submitted
    refused = defs.resolve_implicit_global_asset_job_def().execute_in_process(
        instance=dg.DagsterInstance.ephemeral(),
        asset_selection=[dg.AssetKey(["models", NAME])],
        partition_key="2026-07-10",
        raise_on_error=False,
    )
    assert not refused.success
    (failure,) = refused.get_step_failure_events()
    assert f"refusing to train {NAME}: {said}" in failure.step_failure_data.error.message  # type: ignore[union-attr]

    rebuilt = run_cli("build-trainer", str(source), "--model-name", NAME, "--base", file_base)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert json.loads((root / LOCK_NAME).read_text())["models"][NAME]["version"] == second
    assert run_cli("check", "--module", "proj_defs", env=env).returncode == 0


def test_new_model_scaffolds_a_pinned_trainer_and_its_declaration(
    tmp_path: Path, file_base: str
) -> None:
    """`zipline-dagster new-model` copies the reference trainer under its own name, pins
    it and writes a defs module declaring it from the pin: `check` passes at once, and
    names the drift once the new trainer is edited. It never overwrites."""
    root = tmp_path / "proj"
    shutil.copytree(
        TRAINERS / NAME, root / "trainers" / NAME, ignore=shutil.ignore_patterns("__pycache__")
    )
    (root / "pyproject.toml").write_text('[project]\nname = "proj"\n')
    (root / "proj_defs").mkdir()
    (root / "proj_defs" / "__init__.py").write_text(
        "import dagster as dg\ndefs = dg.Definitions()\n"
    )
    env = {"PYTHONPATH": f"{ROOT}:{root}", "ZIPLINE_ARTIFACT_BASE": file_base}

    # a declaration that does not load is refused before anything is written or uploaded
    refused = run_cli("new-model", "churn_model", "--window", "0", "--module", "proj_defs",
                      env=env)  # fmt: skip
    assert refused.returncode == 1
    assert (
        "error: new-model 'churn_model': the code location proj_defs does not load with it "
        "(--table, --features, --label, --keys, --window and --threshold are its declaration's), "
        "so nothing was written: ModelSpecError: Window.length=0 is invalid; expected a whole number >= 1"
    ) in refused.stderr
    assert sorted(p.name for p in root.rglob("*") if "churn" in p.name) == []
    assert not (root / LOCK_NAME).exists()
    assert not list(Path(file_base[len("file://") :]).rglob("churn_model-*"))

    made = run_cli("new-model", "churn_model", "--window", "7", "--module", "proj_defs", env=env)
    assert made.returncode == 0, made.stderr
    # a code location that lists its models by hand is told to add it
    assert "note: the defs of proj_defs do not include churn_model" in made.stderr
    trainer = root / "trainers" / "churn_model"
    assert 'name="churn_model"' in (trainer / "setup.py").read_text()
    version = build_trainer_archive(trainer).version
    assert made.stdout.strip() == f"version={version}"
    assert json.loads((root / LOCK_NAME).read_text())["models"]["churn_model"]["version"] == (
        version
    )
    assert (Path(file_base[len("file://") :]) / "builds" / f"churn_model-{version}.zip").is_file()
    declared = (root / "proj_defs" / "churn_model.py").read_text()
    assert 'pinned_version("churn_model", near=__file__)' in declared
    assert "Window(length=7, time_unit=TimeUnit.DAYS)" in declared
    ok = run_cli("check", "--module", "proj_defs", env=env)
    assert ok.returncode == 0, ok.stderr
    assert "ok: 1 model(s) of proj_defs" in ok.stdout

    again = run_cli("new-model", "churn_model", "--module", "proj_defs", env=env)
    assert again.returncode == 1 and "already exists; nothing was written" in again.stderr
    bad = run_cli("new-model", "Churn", "--module", "proj_defs", env=env)
    assert bad.returncode == 1 and "new-model 'Churn': expected a safe path segment" in bad.stderr

    # a regression model: the reference regressor, its gate, scores and monitoring
    shutil.copytree(
        TRAINERS / "listing_price_model",
        root / "trainers" / "listing_price_model",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    label_read = run_cli("new-model", "price_model", "--task", "regression", "--label", "price_log",
                         "--features", "price_log,inventory_count", "--module", "proj_defs", env=env)  # fmt: skip
    assert (
        label_read.returncode == 1
        and ("--label=price_log is also among --features; a model does not read its label")
        in label_read.stderr
    )
    priced = run_cli("new-model", "price_model", "--task", "regression", "--label", "price_log",
                     "--module", "proj_defs", env=env)  # fmt: skip
    assert priced.returncode == 0, priced.stderr
    assert "(from " in priced.stderr and "listing_price_model)" in priced.stderr
    declared = (root / "proj_defs" / "price_model.py").read_text()
    for line in (
        'task="regression"',
        'Metric(name="holdout_r2", threshold=0.5)',
        '"label-column": "price_log"',
        'label_column="price_log"',
        "price_model_scores = ModelTransforms(",
    ):
        assert line in declared, line
    assert "(realized rmse, mae, r2)" in declared

    train = trainer / "trainer" / "train.py"
    train.write_text(train.read_text() + "\n# edited\n")
    drifted = run_cli("check", "--module", "proj_defs", env=env)
    assert drifted.returncode == 1
    assert f"model 'churn_model' pins trainer version {version}, but its source" in drifted.stderr
