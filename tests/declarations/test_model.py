from __future__ import annotations

from typing import Any

import pytest

from zipline_dagster import (
    EventSource,
    InferenceSpec,
    Model,
    ModelBackend,
    ModelSpecError,
    Query,
    ResourceConfig,
    TimeUnit,
    TrainingSpec,
    Window,
    selects,
)


def make_model(**overrides: Any) -> Model:
    job_configs = overrides.pop("job_configs", {"label-column": "label", "eval-days": "1"})
    resource_config = overrides.pop(
        "resource_config", ResourceConfig(min_replica_count=0, max_replica_count=0)
    )
    model_name = overrides.pop("model_name", "listing_ctr_model")
    kwargs: dict[str, Any] = {
        "version": "afce3c0e00af",
        "model_artifact_base_uri": "s3://bucket/warehouse",
        "inference_spec": InferenceSpec(
            model_backend=ModelBackend.RAY,
            model_backend_params={"model_name": model_name, "model_type": "custom"},
        ),
        "training_conf": TrainingSpec(
            training_data_source=EventSource(
                table="ctr.labels_v1",
                query=Query(selects=selects("price_log", "label"), start_partition="2026-07-01"),
            ),
            training_data_window=Window(length=4, time_unit=TimeUnit.DAYS),
            python_module="trainer.train",
            resource_config=resource_config,
            job_configs=job_configs,
        ),
    }
    kwargs.update(overrides)
    return Model(**kwargs)


def test_design_example_is_accepted() -> None:
    m = make_model()
    assert m.name == "listing_ctr_model"
    assert m.table == "ctr.labels_v1"
    assert m.window_days == 4
    assert m.training_conf.resource_config.max_replica_count == 0


def test_selects_maps_columns_and_aliases() -> None:
    assert selects("a", "b", c="a + b") == {"a": "a", "b": "b", "c": "a + b"}


@pytest.mark.parametrize(
    "version", ["1.0", "latest", "AFCE3C0E00AF", "afce3c0e00a", "g" * 12, "a" * 65, ""]
)
def test_version_must_be_content_address(version: str) -> None:
    with pytest.raises(ModelSpecError) as exc:
        make_model(version=version)
    msg = str(exc.value)
    assert "'listing_ctr_model'" in msg
    assert "version=" in msg and repr(version) in msg
    assert "12 to 64 lowercase hex" in msg


@pytest.mark.parametrize("version", ["a" * 12, "0123456789abcdef" * 4])
def test_version_bounds_accepted(version: str) -> None:
    assert make_model(version=version).version == version


@pytest.mark.parametrize("name", ["Listing", "../etc", "a/b", "-lead", "has space", "", "ünï"])
def test_model_name_must_be_safe_path_segment(name: str) -> None:
    with pytest.raises(ModelSpecError) as exc:
        make_model(model_name=name)
    msg = str(exc.value)
    assert "model_name" in msg and repr(name) in msg
    assert "[a-z0-9_][a-z0-9_-]*" in msg


def test_missing_model_name_is_refused() -> None:
    with pytest.raises(ModelSpecError, match="model_name"):
        make_model(inference_spec=InferenceSpec(model_backend_params={"model_type": "custom"}))


def test_resource_config_max_defaults_to_min() -> None:
    assert ResourceConfig(min_replica_count=3).max_replica_count == 3
    assert ResourceConfig().max_replica_count == 0


def test_resource_config_min_above_max_refused() -> None:
    with pytest.raises(ModelSpecError) as exc:
        ResourceConfig(min_replica_count=4, max_replica_count=2)
    msg = str(exc.value)
    assert (
        "min_replica_count=4" in msg
        and "max_replica_count=2" in msg
        and "min must be <= max" in msg
    )


@pytest.mark.parametrize("value", [-1, 1.5, "2", True])
def test_resource_config_counts_must_be_whole(value: Any) -> None:
    with pytest.raises(ModelSpecError, match="min_replica_count"):
        ResourceConfig(min_replica_count=value)


@pytest.mark.parametrize("key", ["input-table", "start-ds", "end-ds"])
def test_platform_owned_job_config_keys_refused(key: str) -> None:
    with pytest.raises(ModelSpecError) as exc:
        make_model(job_configs={key: "x"})
    msg = str(exc.value)
    assert "'listing_ctr_model'" in msg and repr(key) in msg
    assert "set by the platform" in msg
    assert "end-ds, input-table, start-ds" in msg


def test_derived_keys_may_be_overridden() -> None:
    m = make_model(job_configs={"model-dir": "s3://elsewhere/m", "warehouse": "s3://wh"})
    assert m.training_conf.job_configs["model-dir"] == "s3://elsewhere/m"


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("client-secret", "s3cr3t-value"),
        ("db-password", "hunter2"),
        ("api-key", "abcdef123456"),
        ("auth-token", "t0k3n"),
        ("aws-key", "AKIAABCDEFGHIJKLMNOP"),
        ("header", "ghp_" + "a" * 36),
        ("conn", "postgres://user:pw@db.example.com/x"),
        ("pem", "-----BEGIN RSA PRIVATE KEY-----"),
        ("dbx", "dapi" + "0" * 32),
    ],
)
def test_secret_values_refused_without_echo(key: str, value: str) -> None:
    with pytest.raises(ModelSpecError) as exc:
        make_model(job_configs={key: value})
    msg = str(exc.value)
    assert "looks like a secret" in msg and repr(key) in msg
    assert value not in msg, "the secret itself must never be echoed"
    assert "DATABRICKS_CLIENT_SECRET" in msg  # tells what to do instead


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("client-secret-env", "DATABRICKS_CLIENT_SECRET"),
        ("client-id-env", "DATABRICKS_CLIENT_ID"),
        ("max-tokens", "512"),
        ("features", "price_log:price_log,inventory_count:inventory_count"),
    ],
)
def test_env_var_names_and_ordinary_values_accepted(key: str, value: str) -> None:
    assert make_model(job_configs={key: value}).training_conf.job_configs[key] == value


@pytest.mark.parametrize(
    ("job_configs", "fragment"),
    [
        ({"bad key": "x"}, "flag name"),
        ({"depth": 4}, "expected a string"),
        ({"x": "a\nb"}, "single-line"),
    ],
)
def test_malformed_job_configs_refused(job_configs: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ModelSpecError, match=fragment):
        make_model(job_configs=job_configs)


@pytest.mark.parametrize(
    "uri", ["bucket/warehouse", "http://x/y", "s3://", "file://relative/path", ""]
)
def test_base_uri_scheme_checked(uri: str) -> None:
    with pytest.raises(ModelSpecError) as exc:
        make_model(model_artifact_base_uri=uri)
    assert "model_artifact_base_uri" in str(exc.value) and repr(uri) in str(exc.value)


@pytest.mark.parametrize(
    "uri", ["file:///tmp/wh", "s3://b/p", "gs://b/p", "abfss://c@acct.dfs.core.windows.net/p"]
)
def test_base_uri_schemes_accepted(uri: str) -> None:
    assert make_model(model_artifact_base_uri=uri).model_artifact_base_uri == uri


def test_python_module_checked() -> None:
    with pytest.raises(ModelSpecError, match="python_module"):
        make_model(
            training_conf=TrainingSpec(
                training_data_source=EventSource(table="ctr.labels_v1"),
                training_data_window=Window(length=4),
                python_module="trainer/train.py",
            )
        )


@pytest.mark.parametrize("table", ["labels", "a.b.c.d", "ctr.labels-v1", ""])
def test_table_name_shape_checked(table: str) -> None:
    with pytest.raises(ModelSpecError, match="EventSource.table"):
        EventSource(table=table)


@pytest.mark.parametrize("length", [0, -1, 2.5, True])
def test_window_length_checked(length: Any) -> None:
    with pytest.raises(ModelSpecError, match="Window.length"):
        Window(length=length)


def test_start_partition_checked() -> None:
    with pytest.raises(ModelSpecError, match="start_partition"):
        Query(start_partition="07/01/2026")


PEM = (
    "-----BEGIN OPENSSH PRIVATE KEY-----\n"
    "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n"
    "-----END OPENSSH PRIVATE KEY-----"
)


@pytest.mark.parametrize(
    ("job_configs", "fragment"),
    [
        ({"ssh-key-material": PEM}, "single-line"),  # multi-line: refused before secret check
        ({"notes": "line one\nzq-unique-9f3"}, "single-line"),
        ({"start-ds": "zq-unique-9f3-AKIAABCDEFGHIJKLMNOP"}, "set by the platform"),
        ({"input-table": PEM}, "set by the platform"),
        ({"end-ds": "zq-unique-9f3"}, "set by the platform"),
        ({"client-secret": "zq-unique-9f3"}, "looks like a secret"),
        ({"depth": ["zq-unique-9f3"]}, "expected a string"),
    ],
)
def test_no_refusal_echoes_the_refused_value(job_configs: dict[str, Any], fragment: str) -> None:
    """Refusals land in logs and the UI: they describe the value, never show it."""
    import traceback

    with pytest.raises(ModelSpecError) as exc:
        make_model(job_configs=job_configs)
    text = "".join(traceback.format_exception(exc.value))  # the message and any cause
    assert fragment in text
    value = next(iter(job_configs.values()))
    for piece in value if isinstance(value, list) else value.splitlines():
        assert piece not in text, f"refused value echoed: {text}"
    assert "zq-unique-9f3" not in text and "b3BlbnNzaC1rZXkt" not in text
    assert "not shown" in text or "type list" in text  # says what it was instead


def test_refusal_describes_kind_and_length() -> None:
    with pytest.raises(ModelSpecError) as exc:
        make_model(job_configs={"key-material": PEM})
    assert f"a {len(PEM)}-character 3-line string (not shown)" in str(exc.value)
