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
from zipline_dagster.storage.catalog import WarehouseError
from zipline_dagster.storage.metadata import column_schema, day_metadata
from zipline_dagster.storage.resources import WarehouseResource
from zipline_dagster.storage.table_days import TableDay

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
        kinds={"spark", "iceberg"},
        description=producer.description or f"{kind} {producer.name} -> table {producer.table}",
        metadata={"zipline/table": producer.table, "zipline/producer": kind},
        automation_condition=automation_condition,
    )
    def _producer_asset(
        context: dg.AssetExecutionContext, spark: SparkResource, warehouse: WarehouseResource
    ) -> dg.MaterializeResult:
        days = daily_partitions.get_partition_keys_in_range(context.partition_key_range)
        tables = warehouse.tables()
        context.log.info(
            f"{kind} {producer.name}: computing {producer.table} for {days[0]}..{days[-1]} on Spark"
        )
        try:
            df = compute(spark.spark_session, tables, producer, days, first_day=PARTITIONS_START)
        except (ProducerError, WarehouseError) as exc:  # the catalog unreachable, say
            raise failure(exc) from None
        errors: dict[str, str] = {}
        committed: dict[str, TableDay] = {}
        try:
            committed = write_days(
                df,
                tables,
                producer.table,
                days,
                run_id=context.run.run_id,
                code_version=declaration_version(producer),
            )
        except DaysNotCommitted as exc:  # the days not committed (or replaced) fail, named
            errors, committed = exc.failed, exc.committed
        # the range, when the run wrote several days in one Spark job
        ranged = {"range": dg.MetadataValue.text(f"{days[0]}..{days[-1]}")} if days[1:] else {}
        schema = column_schema(tables, producer.table) if committed else None
        done = {ds: day_metadata(day, schema, ranged) for ds, day in committed.items()}
        return record_range(
            context,
            days,
            done,
            errors,
            name=producer.table,
            verb="committed",
            code_version=declaration_version(producer),
            data_versions={ds: day.data_version for ds, day in committed.items()},
        )

    return _producer_asset
