"""The code location's resources, from the settings (embedded defaults or environment)."""

from __future__ import annotations

from zipline_dagster.features.spark import SparkResource
from zipline_dagster.jobs.resources import LocalLauncherResource, RayJobsResource
from zipline_dagster.settings import settings
from zipline_dagster.storage.resources import default_warehouse


def resources() -> dict[str, object]:
    env = settings()
    return {
        # ZIPLINE_LAUNCHER=local runs trainers as local subprocesses (no cluster).
        "launcher": LocalLauncherResource()
        if env.launcher == "local"
        else RayJobsResource(address=env.ray_address),
        "spark": SparkResource(master=env.spark_master),
        "warehouse": default_warehouse(for_definitions=True),
    }
