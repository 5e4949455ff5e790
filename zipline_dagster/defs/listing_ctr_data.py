"""A deterministic synthetic listing dataset with a real click signal.

Each listing has a hidden quality and a usual price; a view is clicked more often for
good listings, for prices below the usual one and for well-stocked listings. Past
click-through of a listing therefore predicts its next clicks: a model trained on the
demo's features scores an AUC clearly above 0.5 (a leak would score near 1.0).
"""

import datetime as dt
from typing import Any

import dagster as dg

from zipline_dagster.lineage.partitions import daily_partitions, table_asset_key
from zipline_dagster.storage.metadata import column_schema, day_metadata
from zipline_dagster.storage.resources import WarehouseResource

LISTINGS = 300
VIEWS_PER_LISTING_PER_DAY = 8
SEED = 7


def listing_views(ds: str, *, listings: int = LISTINGS, seed: int = SEED) -> Any:
    import numpy as np
    import pandas as pd

    static = np.random.default_rng(seed)
    quality = static.normal(0.0, 1.0, listings)
    usual_price = np.exp(static.normal(4.0, 0.5, listings))
    stock = static.integers(0, 40, listings)

    day = dt.date.fromisoformat(ds)
    rng = np.random.default_rng([seed, day.toordinal()])
    views = rng.poisson(VIEWS_PER_LISTING_PER_DAY, listings)
    listing = np.repeat(np.arange(listings), views)
    n = len(listing)
    price = usual_price[listing] * np.exp(rng.normal(0.0, 0.15, n))
    inventory = np.maximum(0, stock[listing] + rng.integers(-5, 6, n))
    logit = (
        -2.0
        + 1.1 * quality[listing]
        - 2.0 * np.log(price / usual_price[listing])
        + 0.03 * (inventory - 20)
    )
    clicked = rng.random(n) < 1.0 / (1.0 + np.exp(-logit))
    seconds = rng.integers(0, 86_400, n)
    ts = pd.Timestamp(ds) + pd.to_timedelta(seconds, unit="s")
    return pd.DataFrame(
        {
            # unique within the day: what a label joins to its score on (monitoring)
            "view_id": np.arange(n, dtype="int64"),
            "listing_id": listing.astype("int64"),
            "ts": ts,
            "price": price.round(2),
            "inventory_count": inventory.astype("int64"),
            "clicked": clicked.astype("int64"),
        }
    ).sort_values(["ts", "listing_id"], ignore_index=True)


def build_listing_views_asset(table: str = "ctr.listing_views") -> dg.AssetsDefinition:
    @dg.asset(
        key=table_asset_key(table),
        group_name="sources",
        partitions_def=daily_partitions,
        backfill_policy=dg.BackfillPolicy.single_run(),
        code_version=f"synthetic-v1-seed{SEED}",
        kinds={"python", "iceberg"},
        description="Synthetic listing view events (the demo's stand-in for an event log).",
        metadata={"zipline/table": table},
    )
    def _views(
        context: dg.AssetExecutionContext, warehouse: WarehouseResource
    ) -> dg.MaterializeResult:
        days = daily_partitions.get_partition_keys_in_range(context.partition_key_range)
        tables = warehouse.tables()
        written = [
            tables.write_frame(
                table,
                ds,
                listing_views(ds),
                run_id=context.run.run_id,
                code_version=f"synthetic-v1-seed{SEED}",
            )
            for ds in days
        ]
        schema = column_schema(tables, table)
        for day in written:
            context.add_asset_metadata(day_metadata(day, schema), partition_key=day.ds)
        return dg.MaterializeResult()

    return _views
