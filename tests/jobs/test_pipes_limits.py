"""Pins the Dagster Pipes facts docs/trainers.md ("Why the channel, not Dagster Pipes")
rests on: a Pipes session reports an asset's materialization (and its checks) without a
partition, once per asset. A range job's per-day results need both; when a Pipes
release takes a partition, this fails and the choice is to be made again."""

import inspect
import sys
from pathlib import Path

import dagster as dg
from dagster_pipes import PipesContext

from zipline_dagster.lineage.internals import (
    ASSET_PARTITION_RANGE_END_TAG,
    ASSET_PARTITION_RANGE_START_TAG,
)

EXTERNAL = """
import sys
from dagster_pipes import open_dagster_pipes

with open_dagster_pipes() as pipes:
    pipes.report_asset_materialization(metadata={"day": "2026-07-01"})
    try:  # a range job's second day
        pipes.report_asset_materialization(metadata={"day": "2026-07-02"})
    except Exception as exc:
        open(sys.argv[1], "w").write(str(exc))
"""


def test_pipes_reports_carry_no_partition_and_one_materialization_per_asset(
    tmp_path: Path,
) -> None:
    for method in (PipesContext.report_asset_materialization, PipesContext.report_asset_check):
        params = set(inspect.signature(method).parameters)
        assert not {p for p in params if "partition" in p}, (method.__name__, params)

    script, refused = tmp_path / "external.py", tmp_path / "refused.txt"
    script.write_text(EXTERNAL)
    days = dg.DailyPartitionsDefinition(start_date="2026-07-01")

    @dg.asset(partitions_def=days, backfill_policy=dg.BackfillPolicy.single_run())
    def range_job(
        context: dg.AssetExecutionContext, pipes: dg.PipesSubprocessClient
    ) -> dg.MaterializeResult:
        return pipes.run(
            command=[sys.executable, str(script), str(refused)], context=context
        ).get_materialize_result()

    instance = dg.DagsterInstance.ephemeral()
    result = dg.materialize(
        [range_job],
        instance=instance,
        resources={"pipes": dg.PipesSubprocessClient()},
        tags={
            ASSET_PARTITION_RANGE_START_TAG: "2026-07-01",
            ASSET_PARTITION_RANGE_END_TAG: "2026-07-02",
        },
    )
    assert result.success
    assert "Asset has already been materialized" in refused.read_text()
    # the one report Pipes took stands for the whole range, the first day's metadata on
    # both days: nothing tells which day trained
    events = result.get_asset_materialization_events()
    days_seen = {e.materialization.metadata["day"].value for e in events}
    assert days_seen == {"2026-07-01"}
