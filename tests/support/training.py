"""Model partitions trained in a test: a model of the training table, its resources (local or Ray launcher) and its materialization."""

from __future__ import annotations

import os
from typing import Any

import dagster as dg
from dagster_aws.s3 import S3Resource

from zipline_dagster import EventSource, InferenceSpec, Model, ResourceConfig, TrainingSpec, Window
from zipline_dagster.jobs.resources import LocalLauncherResource, RayJobsResource
from zipline_dagster.storage.resources import WarehouseResource
from zipline_dagster.tracking import MlflowResource
from zipline_dagster.training.assets import build_model_asset

DS = "2026-07-10"
TABLE = "ctr.training_v1"
FEATURES = "price_log:price_log,inventory_count:inventory_count"


def make_model(
    version: str,
    base: str,
    *,
    name: str = "listing_ctr_model",
    job_configs: dict[str, str] | None = None,
    replicas: int = 0,
    python_module: str = "trainer.train",
) -> Model:
    return Model(
        version=version,
        model_artifact_base_uri=base,
        inference_spec=InferenceSpec(
            model_backend_params={"model_name": name, "model_type": "custom"}
        ),
        training_conf=TrainingSpec(
            training_data_source=EventSource(table=TABLE),
            training_data_window=Window(length=4),
            python_module=python_module,
            resource_config=ResourceConfig(min_replica_count=replicas),
            job_configs=job_configs
            if job_configs is not None
            else {
                "label-column": "label",
                "eval-days": "1",
                "features": FEATURES,
                "num-rounds": "20",
            },
        ),
    )


def resources(
    ray_address: str | None,
    warehouse: str,
    env: dict[str, str] | None = None,
    **ray_options: Any,
) -> dict[str, Any]:
    """Resources for one test; ``ray_address=None`` selects the local launcher. ``env``:
    the storage servers' environment (their endpoints). ``ray_options``: RayJobsResource
    fields over the tests' defaults (a resource's fields must be set when it is built:
    Dagster builds the resource again from its config, so ``model_copy`` is lost)."""
    env = env or {}
    s3 = S3Resource(endpoint_url=env.get("AWS_ENDPOINT_URL"), region_name="us-east-1")
    launcher = (
        RayJobsResource(address=ray_address, **{"poll_max_s": 0.5, "timeout_s": 300, **ray_options})
        if ray_address
        else LocalLauncherResource(timeout_s=300)
    )
    return {
        "launcher": launcher,
        "mlflow": MlflowResource(),  # off
        "warehouse": WarehouseResource(
            uri=warehouse,
            s3=s3,
            gcs_endpoint_url=env.get("STORAGE_EMULATOR_HOST"),
            azure_connection_string=env.get("AZURE_STORAGE_CONNECTION_STRING"),
        ),
    }


def materialize(
    model: Model, res: dict[str, Any], ds: str = DS, **kw: Any
) -> dg.ExecuteInProcessResult:
    return dg.materialize(
        [build_model_asset(model=model)],
        partition_key=ds,
        resources=res,
        instance=dg.DagsterInstance.ephemeral(),
        **kw,
    )


def only_materialization(result: dg.ExecuteInProcessResult) -> dg.AssetMaterialization:
    mats = result.get_asset_materialization_events()
    assert len(mats) == 1
    mat = mats[0].event_specific_data.materialization  # type: ignore[union-attr]
    return mat


def ray_client(address: str) -> Any:
    from ray.job_submission import JobSubmissionClient

    os.environ["RAY_AUTH_MODE"] = "disabled"
    return JobSubmissionClient(address)


BUCKETS = {"s3": "s3_bucket", "gs": "gs_bucket", "abfss": "abfss_container", "file": "file_base"}
