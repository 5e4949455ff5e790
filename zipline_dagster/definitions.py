"""The demo code location ``workspace.yaml`` loads: listing click-through, end to end.

listing_views (synthetic events)
  -> listing_features_v1 (GroupBy: views, clicks, price, inventory over 1 and 7 days)
  -> labels_v1 (StagingQuery: one labelled row per view)
  -> training_v1 (Join: each view with its listing's features as of the day before)
  -> models/listing_ctr_model (Ray Job, 4-day window, last day held out)

Importing this module starts neither Ray nor Spark. Settings come from the environment
(see ``settings.py`` and the deployment guide).
"""

import os

from dagster_aws.s3 import S3Resource

from zipline_dagster import (
    EventSource,
    InferenceSpec,
    Model,
    ModelBackend,
    Query,
    ResourceConfig,
    TimeUnit,
    TrainingSpec,
    Window,
    selects,
)
from zipline_dagster.demo_data import build_listing_views_asset
from zipline_dagster.features import (
    Aggregation,
    EventTable,
    GroupBy,
    Join,
    JoinPart,
    Operation,
    StagingQuery,
)
from zipline_dagster.registry import SourceTable, build_definitions
from zipline_dagster.resources import LocalLauncherResource, RayJobsResource, WarehouseResource
from zipline_dagster.settings import artifact_base_uri, warehouse_uri
from zipline_dagster.spark import SparkResource

#: Content address of trainers/listing_ctr_model (`zipline-dagster build-trainer` prints
#: it). A test fails when the trainer changes and this is not updated.
LISTING_CTR_MODEL_VERSION = "599a10f916b2"

listing_views = SourceTable(
    table="ctr.listing_views", asset=build_listing_views_asset("ctr.listing_views")
)

listing_features = GroupBy(
    name="listing_features_v1",
    table="ctr.listing_features_v1",
    source=EventTable(table="ctr.listing_views", time_column="ts"),
    keys=["listing_id"],
    aggregations=[
        Aggregation("clicked", Operation.COUNT, [Window(1), Window(7)]),
        Aggregation("clicked", Operation.SUM, [Window(1), Window(7)]),
        Aggregation("price", Operation.AVERAGE, [Window(7)]),
        Aggregation("inventory_count", Operation.LAST, [Window(7)]),
    ],
    description="Per-listing view counts, clicks, mean price and last inventory over 1 and 7 days.",
)

ctr_labels = StagingQuery(
    name="labels_v1",
    table="ctr.labels_v1",
    query=(
        "SELECT listing_id, ts, price, inventory_count, clicked AS label, ds "
        "FROM ctr.listing_views WHERE ds BETWEEN '{{ start_date }}' AND '{{ end_date }}'"
    ),
    dependencies=["ctr.listing_views"],
    description="One labelled row per listing view: label = clicked.",
)

training_table = Join(
    name="training_v1",
    table="ctr.training_v1",
    left=EventTable(
        table="ctr.labels_v1",
        query=Query(
            selects=selects(
                "listing_id",
                "inventory_count",
                "label",
                price_log="ln(price)",
            )
        ),
    ),
    right_parts=[JoinPart(group_by=listing_features)],
    description="Each labelled view with its listing's features as of the end of the day before.",
)

FEATURES = (
    "price_log",
    "inventory_count",
    "clicked_count_7d",
    "clicked_sum_7d",
    "clicked_sum_1d",
    "price_avg_7d",
)

listing_ctr_model = Model(
    version=LISTING_CTR_MODEL_VERSION,
    model_artifact_base_uri=artifact_base_uri(),
    inference_spec=InferenceSpec(
        model_backend=ModelBackend.RAY,
        model_backend_params={"model_name": "listing_ctr_model", "model_type": "custom"},
    ),
    training_conf=TrainingSpec(
        training_data_source=EventSource(
            table=training_table.table,
            # the columns the trainer reads (its --columns) and the first day it may use
            query=Query(selects=selects(*FEATURES, "label"), start_partition="2026-07-01"),
        ),
        training_data_window=Window(length=4, time_unit=TimeUnit.DAYS),
        python_module="trainer.train",
        resource_config=ResourceConfig(min_replica_count=0, max_replica_count=0),
        job_configs={
            "features": ",".join(FEATURES),
            "label-column": "label",
            "eval-days": "1",
            "max-depth": "4",
            "num-rounds": "60",
        },
    ),
)


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


defs = build_definitions(
    sources=[listing_views],
    producers=[listing_features, ctr_labels, training_table],
    models=[listing_ctr_model],
    resources=resources(),
)
