"""The code location's resources, from the settings (embedded defaults or environment)."""

from __future__ import annotations

from dagster_aws.s3 import S3Resource

from zipline_dagster.features.spark import SparkResource
from zipline_dagster.settings import settings
from zipline_dagster.storage.resources import WarehouseResource
from zipline_dagster.training.resources import LocalLauncherResource, RayJobsResource


def resources() -> dict[str, object]:
    env = settings()
    return {
        # ZIPLINE_LAUNCHER=local runs trainers as local subprocesses (no cluster).
        "launcher": LocalLauncherResource()
        if env.launcher == "local"
        else RayJobsResource(address=env.ray_address),
        "spark": SparkResource(master=env.spark_master),
        "warehouse": WarehouseResource(
            uri=env.warehouse,
            s3=S3Resource(endpoint_url=env.s3_endpoint_url, region_name=env.aws_region),
        ),
    }
