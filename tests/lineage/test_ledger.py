"""The ledger on a real Dagster instance: storage's commits against Dagster's records,
each state of the rule, and what it writes into the instance (a materialization recorded
from storage, a model partition's check evaluations)."""

from typing import Any

import dagster as dg

from tests.helpers import copy_run_as_failed
from zipline_dagster.lineage.ledger import (
    CODE_VERSION_TAG,
    RECORDED_FROM_STORAGE,
    Ledger,
    State,
    prefixed,
)
from zipline_dagster.lineage.partitions import daily_partitions, latest_materialization
from zipline_dagster.storage.commits import MODEL, TABLE, Commit
from zipline_dagster.storage.tables import WRITE_ID

DS = "2026-07-10"
KEY = dg.AssetKey(["ctr", "t"])


@dg.asset(key=KEY, partitions_def=daily_partitions, code_version="v1")
def _table(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
    return dg.MaterializeResult(metadata={WRITE_ID: f"w-{context.run.run_id[:8]}"})


def _write(result: dg.ExecuteInProcessResult) -> str:
    (event,) = result.get_asset_materialization_events()
    return str(event.event_specific_data.materialization.metadata[WRITE_ID].value)  # type: ignore[union-attr]


def _commit(write: str | None, run_id: str | None = None, kind: str = TABLE) -> Commit:
    return Commit(kind, DS, f"file:///wh/ctr/t/ds={DS}", write, run_id=run_id, code_version="v1")


def test_each_state_of_the_rule_and_what_it_records() -> None:
    ours, elsewhere = dg.DagsterInstance.ephemeral(), dg.DagsterInstance.ephemeral()
    first = dg.materialize([_table], partition_key=DS, instance=ours)
    recorded = _write(first)
    ledger = Ledger(ours)

    # the same write: they agree
    same = ledger.settle(KEY, DS, _commit(recorded, first.run_id))
    assert same.state is State.AGREE and same.commit is not None

    # committed by a run still going (a real run's record, started, in our instance):
    # left to that run, nothing written
    going = dg.materialize([_table], partition_key=DS, instance=elsewhere)
    copy_run_as_failed(elsewhere, ours, going.run_id, dg.DagsterRunStatus.STARTED)
    in_flight = ledger.settle(KEY, DS, _commit("w-going", going.run_id))
    assert in_flight.state is State.IN_FLIGHT
    assert in_flight.describe() == (
        f"storage holds write w-going, committed by run {going.run_id} (STARTED), which has "
        "not recorded it yet"
    )
    assert latest_materialization(ours, KEY, DS).run_id == first.run_id  # type: ignore[union-attr]

    # committed by a run the instance does not know (ended elsewhere): recorded from storage
    other = dg.materialize([_table], partition_key=DS, instance=elsewhere)
    held = _write(other)
    diff = ledger.settle(KEY, DS, _commit(held, other.run_id))
    assert diff.state is State.RECORDED and diff.commit is not None
    assert diff.describe() == (
        f"storage holds write {held}, committed by run {other.run_id}, which ended without "
        f"recording it (Dagster had write {recorded} (run {first.run_id})): recorded from "
        "storage"
    )
    latest = latest_materialization(ours, KEY, DS)
    assert latest is not None and latest.asset_materialization is not None
    mat = latest.asset_materialization
    assert mat.metadata[WRITE_ID].value == held
    assert mat.metadata[RECORDED_FROM_STORAGE].value == diff.describe()
    assert mat.metadata["path"].value == f"file:///wh/ctr/t/ds={DS}"
    assert (mat.tags or {})[CODE_VERSION_TAG] == "v1"
    # once recorded, they agree, for this ledger and a new one
    assert ledger.settle(KEY, DS, _commit(held, other.run_id)).state is State.AGREE
    assert Ledger(ours).settle(KEY, DS, _commit(held, other.run_id)).state is State.AGREE

    # recorded and no longer committed: missing; neither side: nothing to say
    assert Ledger(ours).settle(KEY, DS, None).state is State.MISSING
    assert Ledger(ours).settle(KEY, "2026-07-11", None).state is State.AGREE


def test_a_model_partition_recorded_from_storage_gets_its_checks() -> None:
    """The judge's evaluations are reported with the materialization it records; a run of
    the instance that ended without recording its commit is named with its status."""
    ours, elsewhere = dg.DagsterInstance.ephemeral(), dg.DagsterInstance.ephemeral()
    killed = dg.materialize([_table], partition_key=DS, instance=elsewhere)
    copy_run_as_failed(elsewhere, ours, killed.run_id)
    judged: list[str] = []

    def judge(instance: dg.DagsterInstance, key: dg.AssetKey, ds: str) -> list[Any]:
        judged.append(ds)
        target = latest_materialization(instance, key, ds)
        assert target is not None  # judged after it was recorded
        return [
            dg.AssetCheckEvaluation(
                asset_key=key, check_name="gate", passed=True, partition=ds, metadata={}
            )
        ]

    diff = Ledger(ours, judge=judge).settle(KEY, DS, _commit("a1", killed.run_id, kind=MODEL))
    assert diff.state is State.RECORDED and judged == [DS]
    assert f"committed by run {killed.run_id} (FAILURE), which ended" in diff.describe()
    mat = latest_materialization(ours, KEY, DS).asset_materialization  # type: ignore[union-attr]
    assert mat is not None and mat.metadata["attempt"].value == "a1"
    assert mat.metadata["artifact_uri"].value == f"file:///wh/ctr/t/ds={DS}"
    check = ours.event_log_storage.get_latest_asset_check_execution_by_key(
        [dg.AssetCheckKey(KEY, "gate")]
    )
    assert check[dg.AssetCheckKey(KEY, "gate")].status.value == "SUCCEEDED"


def test_admit_is_the_rule_every_step_applies_before_using_a_partition() -> None:
    """``admit``: a partition a run still writes is refused with the ledger's reason; one
    whose run ended unrecorded is recorded and the step warned, naming it; one that
    agrees passes silently."""
    ours, elsewhere = dg.DagsterInstance.ephemeral(), dg.DagsterInstance.ephemeral()
    first = dg.materialize([_table], partition_key=DS, instance=ours)
    warned: list[str] = []
    warn = prefixed(warned.append, f"ctr.t {DS}")
    ledger = Ledger(ours)
    assert ledger.admit(KEY, DS, _commit(_write(first), first.run_id), warn) is None
    assert warned == []

    going = dg.materialize([_table], partition_key=DS, instance=elsewhere)
    copy_run_as_failed(elsewhere, ours, going.run_id, dg.DagsterRunStatus.STARTED)
    why = ledger.admit(KEY, DS, _commit("w-going", going.run_id), warn)
    assert why is not None and "(STARTED), which has not recorded it yet" in why
    assert warned == []

    other = dg.materialize([_table], partition_key=DS, instance=elsewhere)
    assert ledger.admit(KEY, DS, _commit(_write(other), other.run_id), warn) is None
    assert len(warned) == 1 and warned[0].startswith(f"ctr.t {DS}: storage holds write w-")
    assert warned[0].endswith("recorded from storage")
