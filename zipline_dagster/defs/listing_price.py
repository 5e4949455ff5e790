"""The listing price model: a regression on the same training table as the CTR model.

ctr.training_v1 (the CTR model's Join: each view with its listing's features as of the
day before)
  -> models/listing_price_model (Ray Job, 4-day window, last day held out): predicts a
     view's log price from the listing's recent mean price, stock and clicks
     + blocking checks (holdout RMSE <= 0.3, holdout R² >= 0.5, report, manifest)
  -> champions/listing_price_model
  -> ctr.listing_price_model_scores (day ds scored by the newest passing partition at or
     before ds-1)
  -> monitoring/ctr/listing_price_model_scores (realized RMSE, MAE and R² against the
     day's actual log prices)
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
    RolloutStrategy,
    TimeUnit,
    TrainingSpec,
    Window,
    selects,
)
from zipline_dagster.defs.listing_ctr import training_table
from zipline_dagster.jobs.pins import pinned_runtime, pinned_version
from zipline_dagster.settings import artifact_base_uri

#: Content address of trainers/listing_price_model, as trainers.lock pins it.
LISTING_PRICE_MODEL_VERSION = pinned_version("listing_price_model", near=__file__)

#: What the regressor reads besides its label (the view's own price_log is the label).
PRICE_FEATURES = (
    "inventory_count",
    "clicked_count_7d",
    "clicked_sum_7d",
    "price_avg_7d",
)

listing_price_model = Model(
    version=LISTING_PRICE_MODEL_VERSION,
    runtime_version=pinned_runtime(near=__file__),
    model_artifact_base_uri=artifact_base_uri(),
    inference_spec=InferenceSpec(
        model_backend=ModelBackend.RAY,
        model_backend_params={"model_name": "listing_price_model", "model_type": "custom"},
    ),
    training_conf=TrainingSpec(
        training_data_source=EventSource(
            table=training_table.table,
            query=Query(
                selects=selects(*PRICE_FEATURES, "price_log"), start_partition="2026-07-01"
            ),
        ),
        training_data_window=Window(length=4, time_unit=TimeUnit.DAYS),
        python_module="trainer.train",
        job_configs={
            "features": ",".join(PRICE_FEATURES),
            "label-column": "price_log",
            "eval-days": "1",
            "max-depth": "4",
            "num-rounds": "40",
        },
    ),
    task="regression",
    description="A view's log price from its listing's recent mean price, stock and clicks.",
    deployment_conf=DeploymentSpec(
        rollout_strategy=RolloutStrategy(
            rollout_metric_thresholds=[
                Metric(name="holdout_rmse", threshold=0.3),
                Metric(name="holdout_r2", threshold=0.5),
            ],
            regression_tolerance=0.05,
        )
    ),
)

# Day ds of the training table priced by the newest passing partition at or before ds-1,
# and monitored against the day's actual log prices (the same table's label column).
listing_prices = ModelTransforms(
    sources=[EventSource(table=training_table.table)],
    models=[listing_price_model],
    passthrough_fields=["view_id", "listing_id"],
    output_namespace="ctr",
    labels=EventSource(table=training_table.table),
    label_column="price_log",
    label_keys=["view_id"],
)
