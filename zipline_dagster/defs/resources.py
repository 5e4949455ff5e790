"""The code location's resources, from the embedded defaults or the environment."""

from __future__ import annotations

import os

from dagster_aws.s3 import S3Resource

from zipline_dagster.features.spark import SparkResource
from zipline_dagster.settings import warehouse_uri
from zipline_dagster.storage.resources import WarehouseResource
from zipline_dagster.training.resources import LocalLauncherResource, RayJobsResource


def resources() -> dict[str, object]:
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    return {
        # ZIPLINE_LAUNCHER=local runs trainers as local subprocesses (no cluster).
        "launcher": LocalLauncherResource()
        if os.environ.get("ZIPLINE_LAUNCHER") == "local"
        else RayJobsResource(address=os.environ.get("RAY_ADDRESS") or None),
        "spark": SparkResource(master=os.environ.get("SPARK_MASTER") or None),
        "warehouse": WarehouseResource(
            uri=warehouse_uri(),
            s3=S3Resource(endpoint_url=endpoint, region_name=os.environ.get("AWS_REGION") or None),
        ),
    }
