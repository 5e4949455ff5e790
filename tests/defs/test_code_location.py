"""The demo code location: loads without Ray or Spark, pins its trainer, reads its settings."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TRAINERS
from zipline_dagster.jobs.archive import build_trainer_archive

#: the demo's trainers, each pinned in trainers.lock
DEMO_TRAINERS = ["listing_ctr_model", "listing_price_model"]


@pytest.mark.parametrize("model_name", DEMO_TRAINERS)
def test_every_trainer_of_the_project_builds_to_its_pin(model_name: str) -> None:
    """trainers.lock pins what each trainer of the demo builds (a change to a trainer, or
    to the support modules every archive ships, moves it), and the code location declares
    that pin. `make lint` runs this test too, so a stale pin is caught before a commit."""
    from zipline_dagster.defs.listing_ctr import LISTING_CTR_MODEL_VERSION
    from zipline_dagster.defs.listing_price import LISTING_PRICE_MODEL_VERSION
    from zipline_dagster.jobs.pins import find_lock, read_lock

    source = TRAINERS / model_name
    built = build_trainer_archive(source)
    pins = read_lock(find_lock(source))
    assert sorted(pins) == DEMO_TRAINERS
    assert pins[model_name] == {
        "version": built.version,
        "sha256": built.sha256,
        "source": f"trainers/{model_name}",
    }, (
        f"trainers/{model_name} changed: run `zipline-dagster build-trainer "
        f"trainers/{model_name} --model-name {model_name} --base file:///tmp/pins` to pin it"
    )
    declared = {
        "listing_ctr_model": LISTING_CTR_MODEL_VERSION,
        "listing_price_model": LISTING_PRICE_MODEL_VERSION,
    }
    assert built.version == declared[model_name]


def test_the_project_pins_the_runtime_this_repository_builds_to_its_pin() -> None:
    """trainers.lock pins the build of runtime/ (the repository's own zipline-runtime), and
    the demo's models declare that pin: a change to runtime/ that is not adopted
    (`zipline-dagster adopt-runtime`) is caught here, as `make lint` runs this test."""
    from zipline_dagster.defs.listing_ctr import listing_ctr_model
    from zipline_dagster.defs.listing_price import listing_price_model
    from zipline_dagster.jobs.pins import find_lock, read_runtime_pin
    from zipline_dagster.packaging import build_runtime_archive

    built = build_runtime_archive(TRAINERS.parent / "runtime" / "zipline_runtime")
    pin = read_runtime_pin(find_lock(TRAINERS / "listing_ctr_model"))
    assert pin is not None and (pin.version, pin.sha256, pin.protocol) == (
        built.version,
        built.sha256,
        built.protocol,
    ), "runtime/ changed: run `zipline-dagster adopt-runtime` to pin it"
    assert listing_ctr_model.runtime == listing_price_model.runtime == built.version


def test_code_location_loads_without_ray_or_spark() -> None:
    code = (
        "import sys, zipline_dagster.defs as d; d.defs.resolve_asset_graph(); "
        "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'pyspark'))))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == ""


def test_settings_come_from_the_environment_without_contacting_anything() -> None:
    code = """
import json
from zipline_dagster.defs import defs
from zipline_dagster.defs.listing_ctr import listing_ctr_model
r = defs.resources
print(json.dumps({
    "ray": r["launcher"].address, "spark": r["spark"].config()["spark.master"],
    "warehouse": r["warehouse"].uri, "s3": r["warehouse"].s3.endpoint_url,
    "base": listing_ctr_model.model_artifact_base_uri,
}))
"""
    env = {
        "PATH": "/usr/bin:/bin",
        "RAY_ADDRESS": "http://raycluster-head-svc.ml:8265",
        "SPARK_MASTER": "spark://spark-master:7077",
        "ZIPLINE_WAREHOUSE": "s3://acme-warehouse/tables",
        "ZIPLINE_ARTIFACT_BASE": "s3://acme-ml/artifacts",
        "AWS_ENDPOINT_URL": "https://minio.internal:9000",
    }
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert res.returncode == 0, res.stderr
    import json

    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got == {
        "ray": "http://raycluster-head-svc.ml:8265",
        "spark": "spark://spark-master:7077",
        "warehouse": "s3://acme-warehouse/tables",
        "s3": "https://minio.internal:9000",
        "base": "s3://acme-ml/artifacts",
    }


@pytest.mark.slow
def test_dg_loads_the_code_location() -> None:
    """Dagster's project tooling finds and loads the defs package (pyproject [tool.dg])."""
    from tests.conftest import BIN, ROOT

    res = subprocess.run(
        [str(BIN / "dg"), "check", "defs"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "All definitions loaded successfully" in res.stdout + res.stderr
    listed = subprocess.run(
        [str(BIN / "dg"), "list", "defs", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert listed.returncode == 0, listed.stderr
    assert "models/listing_ctr_model" in listed.stdout and "ctr/training_v1" in listed.stdout


def test_the_library_never_imports_the_code_location() -> None:
    import ast

    from tests.conftest import ROOT

    offenders = []
    for path in (ROOT / "zipline_dagster").rglob("*.py"):
        if "defs" in path.relative_to(ROOT / "zipline_dagster").parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            if any(
                n == "zipline_dagster.defs" or n.startswith("zipline_dagster.defs.") for n in names
            ):
                offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []


def test_the_wheel_holds_the_library_and_not_the_demo(tmp_path: Path) -> None:
    import zipfile

    from tests.conftest import ROOT

    uv = ROOT / ".tools" / "bin" / "uv"
    res = subprocess.run(
        [str(uv), "build", "--wheel", "--out-dir", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr
    (wheel,) = tmp_path.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "zipline_dagster/jobs/launchers/ray_job.py" in names
    assert "zipline_dagster/declarations/model.py" in names
    assert "zipline_dagster/features/log4j2.properties" in names  # the Spark driver's logs
    assert not [n for n in names if n.startswith("zipline_dagster/defs/")]


def test_cli_outside_a_project_asks_for_the_module(tmp_path: Path) -> None:
    from tests.conftest import BIN

    res = subprocess.run(
        [
            str(BIN / "zipline-dagster"),
            "backfill",
            "m",
            "--start-ds",
            "2026-07-11",
            "--end-ds",
            "2026-07-11",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "DAGSTER_HOME": str(tmp_path)},
        timeout=120,
    )
    assert res.returncode == 1 and "no Dagster project around" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.slow
def test_archive_ray_cannot_fetch_fails_at_load_naming_scheme_and_reason() -> None:
    """An archive base Ray's agent cannot download from (abfss:// routed to a non-Azure
    endpoint by a connection string) fails `dg check defs`, not a job at training time;
    the local launcher, which reads archives through the platform's storage, loads it."""
    import os

    from tests.conftest import AZURITE_KEY, BIN, ROOT

    env = {
        **os.environ,
        "ZIPLINE_ARTIFACT_BASE": "abfss://ml@devstoreaccount1.dfs.core.windows.net/artifacts",
        "AZURE_STORAGE_CONNECTION_STRING": (
            "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
            f"AccountKey={AZURITE_KEY};BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1;"
        ),
        "ZIPLINE_LAUNCHER": "ray",
        "RAY_ADDRESS": "http://127.0.0.1:9",  # never contacted at load
    }

    def check(**extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "dg"), "check", "defs"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
            env={**env, **extra},
        )

    res = check()
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert "Model 'listing_ctr_model'" in out and "from abfss://" in out
    assert "does not use AZURE_STORAGE_CONNECTION_STRING" in out and "127.0.0.1:10000" in out
    assert AZURITE_KEY not in out
    assert check(ZIPLINE_LAUNCHER="local").returncode == 0
