"""The listing click-through model and the features it trains on: one file per model.

listing_views (synthetic events)
  -> listing_features_v1 (GroupBy: views, clicks, price, inventory over 1 and 7 days)
  -> labels_v1 (StagingQuery: one labelled row per view)
  -> training_v1 (Join: each view with its listing's features as of the day before)
  -> models/listing_ctr_model (Ray Job, 4-day window, last day held out)
     + blocking checks (holdout AUC >= 0.65, report, manifest; no regression shown)
  -> champions/listing_ctr_model (the partition in use: its champion pointer; passes over
     a newer partition more than 0.02 below it)
  -> ctr.listing_ctr_model_scores (day ds scored by the newest partition at or before
     ds-1 passing its gates, a Ray Job)
  -> monitoring/ctr/listing_ctr_model_scores (realized AUC once day ds's labels exist)

The code location (``zipline_dagster.defs``) collects every declaration in this package:
adding a model is adding a file like this one. Importing it starts neither Ray nor Spark.
"""

from zipline_dagster import (
    DeploymentSpec,
    EventSource,
    InferenceSpec,
    Metric,
    Model,
    ModelBackend,
    ModelTransforms,
    Query,
    ResourceConfig,
    RolloutStrategy,
    TimeUnit,
    TrainingSpec,
    Window,
    selects,
)
from zipline_dagster.declarations.features import (
    Aggregation,
    EventTable,
    GroupBy,
    Join,
    JoinPart,
    Operation,
    StagingQuery,
)
from zipline_dagster.definitions import SourceTable
from zipline_dagster.defs.listing_ctr_data import build_listing_views_asset
from zipline_dagster.jobs.pins import pinned_runtime, pinned_version
from zipline_dagster.settings import artifact_base_uri

#: Content address of trainers/listing_ctr_model, as trainers.lock pins it
#: (`zipline-dagster build-trainer` records it there). A changed trainer that is not built
#: again is named at load, by `zipline-dagster check`, and refuses to train.
LISTING_CTR_MODEL_VERSION = pinned_version("listing_ctr_model", near=__file__)

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
        "SELECT view_id, listing_id, ts, price, inventory_count, clicked AS label, ds "
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
                "view_id",
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
    # the job-side runtime build its jobs run with, as trainers.lock pins it
    runtime_version=pinned_runtime(near=__file__),
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
    # A partition becomes the champion only if its holdout AUC is at least 0.65 and not
    # more than 0.02 below the current champion's.
    deployment_conf=DeploymentSpec(
        rollout_strategy=RolloutStrategy(
            rollout_metric_thresholds=[Metric(name="holdout_auc", threshold=0.65)],
            regression_tolerance=0.02,
        )
    ),
)

# Day ds of the training table scored by the newest partition at or before ds-1 passing its
# gates (trained on data before ds: no leakage), and
# monitored against the labels of day ds once they exist.
listing_scores = ModelTransforms(
    sources=[EventSource(table=training_table.table)],
    models=[listing_ctr_model],
    passthrough_fields=["view_id", "listing_id"],
    output_namespace="ctr",
    labels=EventSource(table=ctr_labels.table),
    label_column="label",
    label_keys=["view_id"],
)
