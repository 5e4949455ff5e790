"""Settings: one reader of the environment, with clear errors for bad values."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import ROOT
from zipline_dagster.settings import Settings, SettingsError


def test_embedded_defaults_and_overrides(tmp_path: Path) -> None:
    env = {"ZIPLINE_HOME": str(tmp_path)}
    s = Settings.from_env(env)
    assert s.warehouse == (tmp_path / "warehouse").as_uri() == s.artifact_base
    assert (s.launcher, s.ray_address, s.spark_master) == ("ray", None, None)
    s = Settings.from_env(
        {
            **env,
            "ZIPLINE_WAREHOUSE": "s3://b/wh",
            "ZIPLINE_ARTIFACT_BASE": "s3://b/ml",
            "ZIPLINE_LAUNCHER": "local",
            "RAY_ADDRESS": "http://head:8265",
            "SPARK_MASTER": "spark://m:7077",
            "AWS_ENDPOINT_URL": "http://s3.local:9000",
            "AWS_DEFAULT_REGION": "eu-west-1",
        }
    )
    assert (s.warehouse, s.artifact_base, s.launcher) == ("s3://b/wh", "s3://b/ml", "local")
    assert (s.ray_address, s.spark_master) == ("http://head:8265", "spark://m:7077")
    assert (s.s3_endpoint_url, s.aws_region) == ("http://s3.local:9000", "eu-west-1")


def test_bad_launcher_is_named() -> None:
    with pytest.raises(
        SettingsError, match="ZIPLINE_LAUNCHER='k8s' is invalid; accepted: ray, local"
    ):
        Settings.from_env({"ZIPLINE_LAUNCHER": "k8s"})


def test_only_settings_reads_the_environment() -> None:
    """Other modules pass the environment on to child processes, never read settings from it."""
    readers = []
    library = ROOT / "zipline_dagster"
    for path in library.rglob("*.py"):
        rel = path.relative_to(library)
        # defs/ is the code location (not the library); trainer_io.py runs inside trainer
        # processes on the cluster, where the AWS SDK convention (AWS_ENDPOINT_URL from
        # the cluster's environment, like the credentials) names the S3 endpoint
        skip = {Path("settings.py"), Path("training/trainer_io.py")}
        if rel.parts[0] == "defs" or rel in skip:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                target = ast.unparse(node.func)
                if target in ("os.environ.get", "os.getenv"):
                    readers.append(f"{rel}:{node.lineno}")
    assert readers == []
