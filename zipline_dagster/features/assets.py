"""Daily-partitioned Dagster assets for GroupBy, Join and StagingQuery producers (Spark).

Each asset writes exactly its own partitions of its one table, in a single run for a
whole range (Spark starts once per run, not once per day).
"""

import warnings
from collections.abc import Callable, Mapping

import dagster as dg

from zipline_dagster.declarations.features import GroupBy, Join, Producer, StagingQuery
from zipline_dagster.declarations.versions import declaration_version
from zipline_dagster.errors import failure
from zipline_dagster.features.spark import (
    DaysNotCommitted,
    ProducerError,
    SparkResource,
    compute_group_by,
    compute_join,
    compute_staging_query,
    write_days,
)
from zipline_dagster.lineage.partitions import (
    PARTITIONS_START,
    daily_partitions,
    record_range,
    table_asset_key,
)
from zipline_dagster.storage.paths import table_partition_uri, table_uri
from zipline_dagster.storage.resources import WarehouseResource
from zipline_dagster.storage.tables import (
    TABLE_URI,
    WRITE_ID,
    new_write_id,
    one_listing_per_table,
)

# backfill_policy and allow_nonexistent_upstream_partitions are marked beta; we rely on
# both deliberately and say so once here instead of at every load.
warnings.filterwarnings(
    "ignore",
    category=dg.BetaWarning,
    message=".*(backfill_policy|allow_nonexistent_upstream_partitions).*",
)


def _deps(producer: Producer) -> list[dg.AssetDep]:
    def window(table: str, start: int, end: int = 0) -> dg.AssetDep:
        return dg.AssetDep(
            table_asset_key(table),
            partition_mapping=dg.TimeWindowPartitionMapping(
                start_offset=start, end_offset=end, allow_nonexistent_upstream_partitions=True
            ),
        )

    if isinstance(producer, GroupBy):
        return [window(producer.source.table, -(producer.lookback_days - 1))]
    if isinstance(producer, Join):
        # features of day ds-1 serve the rows of day ds
        return [window(producer.left.table, 0)] + [
            window(p.group_by.table, -1, -1) for p in producer.right_parts
        ]
    return [window(t, -producer.lookback_days) for t in producer.dependencies]


_COMPUTE: Mapping[type, Callable[..., object]] = {
    GroupBy: compute_group_by,
    Join: compute_join,
    StagingQuery: compute_staging_query,
}
_KIND = {GroupBy: "group_by", Join: "join", StagingQuery: "staging_query"}


def build_producer_asset(
    producer: Producer,
    *,
    group_name: str = "features",
    automation_condition: dg.AutomationCondition | None = None,
) -> dg.AssetsDefinition:
    compute = _COMPUTE[type(producer)]
    kind = _KIND[type(producer)]

    @dg.asset(
        key=table_asset_key(producer.table),
        group_name=group_name,
        partitions_def=daily_partitions,
        backfill_policy=dg.BackfillPolicy.single_run(),
        code_version=declaration_version(producer),
        deps=_deps(producer),
        kinds={"spark", "parquet"},
        description=producer.description or f"{kind} {producer.name} -> table {producer.table}",
        metadata={"zipline/table": producer.table, "zipline/producer": kind},
        automation_condition=automation_condition,
    )
    def _producer_asset(
        context: dg.AssetExecutionContext, spark: SparkResource, warehouse: WarehouseResource
    ) -> dg.MaterializeResult:
        days = daily_partitions.get_partition_keys_in_range(context.partition_key_range)
        store = warehouse.store(warehouse.uri)
        context.log.info(
            f"{kind} {producer.name}: computing {producer.table} for {days[0]}..{days[-1]} on Spark"
        )
        try:
            with one_listing_per_table():  # each upstream table listed once per run
                df = compute(
                    spark.spark_session,
                    store,
                    warehouse.uri,
                    producer,
                    days,
                    first_day=PARTITIONS_START,
                )
        except ProducerError as exc:
            raise failure(exc) from None
        errors: dict[str, str] = {}
        write_id = new_write_id()  # recorded, so that storage's commit can be told from it
        try:
            counts = write_days(
                df,
                store,
                warehouse.uri,
                producer.table,
                days,
                warn=context.log.warning,
                write_id=write_id,
                run_id=context.run.run_id,
                code_version=declaration_version(producer),
            )
        except DaysNotCommitted as exc:  # the days committed are recorded, the rest fail
            counts, errors = exc.committed, exc.failed
        # the range, when the run wrote several days in one Spark job
        ranged = {"range": dg.MetadataValue.text(f"{days[0]}..{days[-1]}")} if days[1:] else {}
        done = {
            ds: {
                "table": producer.table,
                "path": dg.MetadataValue.path(
                    table_partition_uri(warehouse.uri, producer.table, ds)
                ),
                "rows": dg.MetadataValue.int(rows),
                WRITE_ID: dg.MetadataValue.text(write_id),
                TABLE_URI: dg.MetadataValue.path(table_uri(warehouse.uri, producer.table)),
                **ranged,
            }
            for ds, rows in counts.items()
        }
        return record_range(
            context,
            days,
            done,
            errors,
            name=producer.table,
            verb="committed",
            code_version=declaration_version(producer),
        )

    return _producer_asset
