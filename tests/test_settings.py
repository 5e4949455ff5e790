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


def test_a_spark_master_spark_does_not_take_is_named_before_any_session() -> None:
    """Spark refuses such a master only in its JVM's stderr; the step said "Java gateway
    process exited before sending its port number"."""
    from zipline_dagster.features.spark import SparkResource

    for ok in ("local", "local[2]", "local[*]", "local[*,3]", "spark://a:7077,b:7077", "yarn"):
        assert Settings.from_env({"SPARK_MASTER": ok}).spark_master == ok
    assert Settings.from_env({"SPARK_MASTER": "k8s://https://api:443"}).spark_master
    accepted = "local, local[N], local[*], spark://host:port, yarn, k8s://https://host:port"
    for bad in ("bogus://x", "local[", "spark:/m:7077", "mesos://m:5050"):
        with pytest.raises(SettingsError) as exc:
            Settings.from_env({"SPARK_MASTER": bad})
        assert (
            str(exc.value)
            == f"SPARK_MASTER={bad!r} is not a Spark master URL; accepted: {accepted}"
        )
    with pytest.raises(SettingsError, match="the spark resource's master='localhost' is not"):
        SparkResource(master="localhost").config()


def test_a_warehouse_or_artifact_base_that_is_no_storage_uri_is_named(tmp_path: Path) -> None:
    """Named as the variable that was set, not as the model's model_artifact_base_uri
    that it becomes."""
    accepted = "expected a URI with a path: file://..., s3://..., gs://..., abfss://..."
    for name in ("ZIPLINE_WAREHOUSE", "ZIPLINE_ARTIFACT_BASE"):
        for bad in ("./wh", "s3:/b/wh", "s3://", "ftp://h/wh"):
            with pytest.raises(SettingsError) as exc:
                Settings.from_env({"ZIPLINE_HOME": str(tmp_path), name: bad})
            assert str(exc.value) == f"{name}={bad!r} is invalid; {accepted}"
        with pytest.raises(SettingsError, match=f"{name}='file://wh' is invalid; expected an absolute file:///path"):  # fmt: skip
            Settings.from_env({"ZIPLINE_HOME": str(tmp_path), name: "file://wh"})
    ok = Settings.from_env({"ZIPLINE_WAREHOUSE": "abfss://c@a.dfs.core.windows.net/wh"})
    assert ok.artifact_base == "abfss://c@a.dfs.core.windows.net/wh"


def test_only_settings_reads_the_environment() -> None:
    """Other modules pass the environment on to child processes, never read settings from it."""
    readers = []
    paths = [*(ROOT / "zipline_dagster").rglob("*.py"), *(ROOT / "trainers").rglob("*.py")]
    for path in paths:
        rel = path.relative_to(ROOT)
        # defs/ is the code location (not the library). Trainers (and their shared
        # trainer_io) read only their flags: storage endpoints and credentials are read
        # by each storage SDK from the job's environment, inherited from the cluster.
        if rel.parts[:2] == ("zipline_dagster", "defs") or rel == Path(
            "zipline_dagster/settings.py"
        ):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                target = ast.unparse(node.func)
                if target in ("os.environ.get", "os.getenv"):
                    # Except what Ray sets for a job's driver: RAY_ADDRESS, its marker of
                    # a job driver (the fan-out trainer's --executor=auto), which ray.init
                    # reads the same way, and OMP_NUM_THREADS, the CPUs it reserved for
                    # the driver (the fan-out driver's threads), which OpenMP reads too.
                    arg = node.args[0] if node.args else None
                    ray_set = ("RAY_ADDRESS", "OMP_NUM_THREADS")
                    if not (isinstance(arg, ast.Constant) and arg.value in ray_set):
                        readers.append(f"{rel}:{node.lineno}")
    assert readers == []


def test_where_job_drivers_go_and_whether_jobs_install_requirements() -> None:
    """A deployment keeps job drivers off the Ray head with a sliver of a worker-only
    resource, and turns off the pip runtime env where the image holds the requirements;
    a value that is not one is named with what is accepted."""
    env = {
        "ZIPLINE_RAY_ENTRYPOINT_RESOURCES": '{"zipline_worker": 0.001}',
        "ZIPLINE_RAY_INSTALL_REQUIREMENTS": "false",
    }
    s = Settings.from_env(env)
    assert s.ray_entrypoint_resources == {"zipline_worker": 0.001}
    assert s.ray_install_requirements is False
    assert Settings.from_env({}).ray_install_requirements is True
    assert Settings.from_env({}).ray_entrypoint_resources is None
    for bad in ('{"zipline_worker": 0}', '["worker"]', "worker=1", '{"w": true}'):
        with pytest.raises(SettingsError, match="ZIPLINE_RAY_ENTRYPOINT_RESOURCES=.* is invalid"):
            Settings.from_env({"ZIPLINE_RAY_ENTRYPOINT_RESOURCES": bad})
    with pytest.raises(
        SettingsError,
        match="ZIPLINE_RAY_INSTALL_REQUIREMENTS='no' is invalid; accepted: true, false",
    ):
        Settings.from_env({"ZIPLINE_RAY_INSTALL_REQUIREMENTS": "no"})


def test_mlflow_is_off_unless_a_tracking_uri_is_set() -> None:
    """MLflow is on only with a tracking URI; its experiment name must hold ``{model}``
    as a placeholder (or none), and the copy switch is true or false."""
    from zipline_dagster.tracking import MlflowResource

    off = Settings.from_env({})
    assert off.mlflow_tracking_uri is None and off.mlflow_experiment == "{model}"
    assert MlflowResource().tracker(print) is None
    on = Settings.from_env(
        {
            "MLFLOW_TRACKING_URI": "http://mlflow:5000",
            "ZIPLINE_MLFLOW_EXPERIMENT": "/Shared/{model}",
            "ZIPLINE_MLFLOW_COPY_ARTIFACTS": "true",
            "ZIPLINE_DAGSTER_URL": "http://dagster:3000",
        }
    )
    assert (on.mlflow_tracking_uri, on.mlflow_experiment) == (
        "http://mlflow:5000",
        "/Shared/{model}",
    )
    assert on.mlflow_copy_artifacts is True and on.dagster_url == "http://dagster:3000"
    with pytest.raises(
        SettingsError, match=r"ZIPLINE_MLFLOW_EXPERIMENT='/Shared/\{name\}' is invalid; .*\{model\}"
    ):
        Settings.from_env({"ZIPLINE_MLFLOW_EXPERIMENT": "/Shared/{name}"})
    with pytest.raises(
        SettingsError, match="ZIPLINE_MLFLOW_COPY_ARTIFACTS='yes' is invalid; accepted: true, false"
    ):
        Settings.from_env({"ZIPLINE_MLFLOW_COPY_ARTIFACTS": "yes"})
