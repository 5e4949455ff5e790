"""The champion pointer end to end: model partitions trained as Ray Jobs on a real local
Ray cluster, their blocking checks, the champion asset, and the CLI's promote/rollback."""

from __future__ import annotations

import dataclasses
import json
import socket
import textwrap
from pathlib import Path
from typing import Any

import dagster as dg
import numpy as np
import pytest
from dagster_aws.s3 import S3Resource

from tests.conftest import ROOT, TRAINERS, run_cli
from tests.helpers import (
    attempt_of,
    copy_run_as_failed,
    ctr_rows,
    days_ending,
    write_partition,
    write_table,
)
from tests.support.champion import DS1, DS2, DS3, THRESHOLD, advance, checks_of, gated, train
from tests.support.training import TABLE, resources
from zipline_dagster import DeploymentSpec, Metric, RolloutStrategy
from zipline_dagster.declarations.versions import model_code_version
from zipline_dagster.jobs.archive import publish_trainer_archive
from zipline_dagster.lineage.partitions import (
    latest_materialization,
)
from zipline_dagster.rollout.assets import (
    build_champion_asset,
    model_asset_key,
)
from zipline_dagster.storage import champion_pointer as cp
from zipline_dagster.storage.blobs import blob_store
from zipline_dagster.tracking import MlflowResource


def write_code_location(tmp_path: Path, version: str, base: str) -> dict[str, str]:
    """A code location module declaring the same model, for the CLI's --module."""
    (tmp_path / "champ_defs.py").write_text(
        textwrap.dedent(
            f"""
            from tests.rollout.test_champion import gated
            from tests.support.training import resources
            from zipline_dagster.definitions import ExternalTable, build_definitions

            model = gated({version!r}, {base!r})
            defs = build_definitions(
                external_tables=[ExternalTable({TABLE!r})],
                models=[model],
                resources=resources(None, {base!r}),
                automation=False,
            )
            """
        )
    )
    return {"PYTHONPATH": f"{ROOT}:{tmp_path}"}


def test_champion_moves_only_to_partitions_passing_every_gate(
    ray_head: Any, file_base: str, trainer_copy: Path, tmp_path: Path
) -> None:
    write_table(file_base, TABLE, days_ending(DS3, 6), rows=400)
    # Day DS2's labels are shuffled: the partition trained on DS2's window holds it out
    # and scores about 0.5, below the threshold. DS3 holds out a clean day again.
    noisy = ctr_rows(DS2, 400)
    noisy["label"] = np.random.default_rng(7).permutation(noisy["label"].to_numpy())
    write_partition(file_base, TABLE, DS2, noisy)
    version = publish_trainer_archive(
        trainer_copy, model_name="listing_ctr_model", base=file_base
    ).version
    model = gated(version, file_base)
    res = resources(ray_head.dashboard_url, file_base)
    instance = dg.DagsterInstance.ephemeral()
    store = blob_store(file_base)

    first = train(model, res, DS1, instance)
    assert first.success
    assert {n: e.passed for n, e in checks_of(first).items()} == {
        "rollout_thresholds": True,
        "no_regression_vs_champion": True,
        "report_complete": True,
        "manifest_verifies": True,
    }
    md = advance(model, res, instance)
    assert md["moved"] is True and md["ds"] == DS1
    pointer = cp.read_champion(store, model)
    assert pointer is not None and pointer.ds == DS1 and pointer.version == version
    # the blocking gates (the comparison with a champion is not one of them)
    assert pointer.checks_passed == (
        "rollout_thresholds",
        "report_complete",
        "manifest_verifies",
    )
    assert pointer.artifact_uri == f"{file_base}/models/listing_ctr_model/{version}/{DS1}"

    # A partition failing its threshold: the check fails with the numbers, blocking.
    second = train(model, res, DS2, instance)
    failed = checks_of(second)["rollout_thresholds"]
    assert not failed.passed
    auc = failed.metadata["holdout_auc"].value
    assert auc < THRESHOLD
    assert failed.metadata["summary"].value == (
        f"holdout_auc={auc:.4f} fails holdout_auc >= {THRESHOLD:g}"
    )
    md = advance(model, res, instance)
    assert md["moved"] is False and md["ds"] == DS1
    rejected = md["rejected"][DS2]
    assert list(md["rejected"]) == [DS2]
    assert rejected == {
        "rollout_thresholds": f"holdout_auc={auc:.4f} fails holdout_auc >= {THRESHOLD:g}"
    }
    assert getattr(cp.read_champion(store, model), "ds", None) == DS1

    # Under a threshold DS2 meets, retraining it after the champion exists succeeds: its
    # gates judge it alone. Being more than the tolerance (0.1) below the champion shows as
    # a warning, and the champion passes over it, saying why.
    lenient = gated(version, file_base)
    lenient = dataclasses.replace(
        lenient,
        deployment_conf=DeploymentSpec(
            rollout_strategy=RolloutStrategy(
                rollout_metric_thresholds=[Metric("holdout_auc", 0.3)], regression_tolerance=0.1
            )
        ),
    )
    again = train(lenient, res, DS2, instance)
    assert again.success
    verdicts = checks_of(again)
    assert {n: e.passed for n, e in verdicts.items()} == {
        "rollout_thresholds": True,
        "no_regression_vs_champion": False,
        "report_complete": True,
        "manifest_verifies": True,
    }
    shown = verdicts["no_regression_vs_champion"]
    assert shown.severity == dg.AssetCheckSeverity.WARN
    assert shown.metadata["summary"].value.endswith("; tolerance 0.1")
    md = advance(lenient, res, instance)
    assert md["moved"] is False and md["ds"] == DS1
    assert md["rejected"][DS2]["no_regression_vs_champion"].startswith("holdout_auc=")
    assert md["reason"] == (
        f"stays at {version}/{DS1}: no newer partition passes every gate "
        f"({DS2} passed but regressed beyond the tolerance 0.1)"
    )

    # The CLI refuses it too, saying why; --force moves it and records that.
    env = write_code_location(tmp_path, version, file_base)
    refused = run_cli(
        "promote", "listing_ctr_model", "--ds", DS2, "--module", "champ_defs", env=env
    )
    assert refused.returncode == 1
    assert f"rollout_thresholds: holdout_auc={auc:.4f} fails" in refused.stderr
    assert "--force" in refused.stderr
    assert getattr(cp.read_champion(store, model), "ds", None) == DS1
    forced = run_cli(
        "promote", "listing_ctr_model", "--ds", DS2, "--force", "--module", "champ_defs", env=env
    )
    assert forced.returncode == 0, forced.stderr
    pointer = json.loads(forced.stdout)
    assert pointer["ds"] == DS2 and pointer["forced"] is True
    assert sorted(pointer["checks_failed"]) == ["rollout_thresholds"]
    assert pointer["why"] == "promoted by hand with --force despite: rollout_thresholds"

    rolled = run_cli("rollback", "listing_ctr_model", "--module", "champ_defs", env=env)
    assert rolled.returncode == 0, rolled.stderr
    back = json.loads(rolled.stdout)
    assert back["ds"] == DS1 and back["why"] == f"rollback from {version}/{DS2}"
    kept = cp.history(store, model)
    assert [(p.ds, p.forced) for p in kept] == [(DS1, False), (DS2, True)]
    # Nothing earlier than the first champion: a second rollback is refused.
    again = run_cli("rollback", "listing_ctr_model", "--module", "champ_defs", env=env)
    assert again.returncode == 1 and "no earlier champion" in again.stderr

    # A newer partition passing every gate moves it (passing over the failed one).
    third = train(model, res, DS3, instance)
    assert all(e.passed for e in checks_of(third).values())
    md = advance(model, res, instance)
    assert md["moved"] is True and md["ds"] == DS3
    assert md["reason"] == "newest partition passing every gate"
    assert getattr(cp.read_champion(store, model), "replaced", None) is not None


@pytest.mark.slow
def test_promote_refuses_an_untrained_partition_even_forced(file_base: str, tmp_path: Path) -> None:
    # no DAGSTER_HOME: its note is for a trained partition only, not before these errors
    env = {**write_code_location(tmp_path, "0123456789ab", file_base), "DAGSTER_HOME": ""}
    res = run_cli(
        "promote", "listing_ctr_model", "--ds", DS1, "--force", "--module", "champ_defs", env=env
    )
    assert res.returncode == 1
    assert res.stderr.startswith("error: cannot promote"), res.stderr
    assert "no _MANIFEST.json" in res.stderr and "even --force" in res.stderr
    unknown = run_cli("promote", "nope", "--ds", DS1, "--module", "champ_defs", env=env)
    assert unknown.returncode == 1
    assert (
        "model 'nope' is not declared" in unknown.stderr and "listing_ctr_model" in unknown.stderr
    )
    # a day or version that is not one never becomes a storage path to look in
    for flag, value, said in [
        ("--ds", "08/10/2026", "ds='08/10/2026' is not a day; expected YYYY-MM-DD"),
        ("--ds", "2026-13-01", "ds='2026-13-01' is not a day; expected YYYY-MM-DD"),
        ("--version", "latest", "version='latest' is not a trainer archive's content address"),
    ]:
        args = ["--ds", DS1, flag, value] if flag == "--version" else [flag, value]
        bad = run_cli("promote", "listing_ctr_model", *args, "--module", "champ_defs", env=env)
        assert bad.returncode == 1 and said in bad.stderr, bad.stderr
        assert "_MANIFEST" not in bad.stderr and "DAGSTER_HOME" not in bad.stderr


@pytest.mark.slow
def test_promote_by_hand_applies_the_ledgers_rule(file_base: str, tmp_path: Path) -> None:
    """`zipline-dagster promote` with DAGSTER_HOME set applies the ledger's rule to the
    partition: a model that a run of the instance promoted and has not recorded yet (the
    run still going) fails `recorded_by_dagster` like a gate (refused, or promoted with
    --force and recorded in the pointer), and the planner leaves it to that run; once
    that run has ended without recording it (killed in between), the model is recorded
    into Dagster from storage and promoted. Without DAGSTER_HOME the CLI says it did not
    check. The run is a real one, on another instance, whose record is copied into ours
    (``copy_run_as_failed``)."""
    write_table(file_base, TABLE, days_ending(DS1, 6), rows=400)
    version = publish_trainer_archive(
        TRAINERS / "listing_ctr_model", model_name="listing_ctr_model", base=file_base
    ).version
    model = gated(version, file_base)
    res = resources(None, file_base)
    home = tmp_path / "dagster_home"
    home.mkdir()
    ours, elsewhere = dg.DagsterInstance.local_temp(str(home)), dg.DagsterInstance.ephemeral()
    other = train(model, res, DS1, elsewhere)
    assert other.success
    held = attempt_of(other)
    copy_run_as_failed(elsewhere, ours, other.run_id, dg.DagsterRunStatus.STARTED)
    env = {**write_code_location(tmp_path, version, file_base), "DAGSTER_HOME": str(home)}
    store = blob_store(file_base)

    def promote(*flags: str, **extra: str) -> Any:
        args = ("promote", model.name, "--ds", DS1, *flags, "--module", "champ_defs")
        return run_cli(*args, env={**env, **extra})

    in_flight = (
        f"storage holds attempt {held}, committed by run {other.run_id} (STARTED), which has "
        "not recorded it yet"
    )
    refused = promote()
    assert refused.returncode == 1
    assert (
        f"refusing to promote {model.name} {version}/{DS1}: recorded_by_dagster: {in_flight}"
    ) in refused.stderr
    assert cp.read_champion(store, model) is None
    # the planner leaves it to that run too: a backfill would train it a second time
    args = ("backfill", model.name, "--start-ds", DS1, "--end-ds", DS1, "--module", "champ_defs")
    backfill = run_cli(*args, env=env)
    assert backfill.returncode == 0, backfill.stderr
    key = model_asset_key(model.name).to_user_string()
    assert f"  {key} {DS1}: left out, in flight: {in_flight}\n" in backfill.stderr
    assert backfill.stdout.strip() == (
        "backfill_id=none (every partition is fresh or left to the run writing it)"
    )
    forced = promote("--force")
    assert forced.returncode == 0, forced.stderr
    pointer = json.loads(forced.stdout)
    assert pointer["checks_failed"] == {"recorded_by_dagster": in_flight}
    assert pointer["why"] == "promoted by hand with --force despite: recorded_by_dagster"
    assert latest_materialization(ours, model_asset_key(model.name), DS1) is None

    run = ours.get_run_by_id(other.run_id)
    assert run is not None
    ours.report_run_failed(run)  # it ended without recording what it promoted
    checked = promote()
    assert checked.returncode == 0, checked.stderr
    assert json.loads(checked.stdout)["why"] == "promoted by hand"
    assert (
        f"warning: {model.name} partition {DS1}: storage holds attempt {held}, committed by run "
        f"{other.run_id} (FAILURE), which ended without recording it (Dagster had no "
        "materialization): recorded from storage"
    ) in checked.stderr
    recorded = latest_materialization(ours, model_asset_key(model.name), DS1)
    assert recorded is not None and recorded.asset_materialization is not None
    assert recorded.asset_materialization.metadata["attempt"].value == held
    unchecked = promote(DAGSTER_HOME="")
    assert unchecked.returncode == 0, unchecked.stderr
    assert "DAGSTER_HOME is not set, so the partition is not checked" in unchecked.stderr


def test_a_champion_lock_that_cannot_be_deleted_leaves_the_move_standing(
    s3_bucket: str, tmp_path: Path
) -> None:
    """On S3 as a role allowed to write but not to delete (a proxy answering every DELETE
    with S3's 403, a real refusal on the wire): once the pointer is written, the lock
    that cannot be deleted no longer fails the move. The champion asset is materialized
    with the pointer storage holds and names the lock in a warning and its metadata;
    `promote` and `rollback` exit 0, move the pointer and warn."""
    from tests.helpers import s3_through_proxy
    from tests.support.jobs import _attempt
    from zipline_dagster.storage.artifacts import (
        promote_attempt,
    )
    from zipline_dagster.storage.resources import WarehouseResource

    version, base = "0123456789ab", f"{s3_bucket}/wh"
    model = gated(version, base)
    report = json.dumps(
        {
            "train": {"rows": 300, "metrics": {"auc": 0.9}},
            "holdout": {"rows": 100, "metrics": {"auc": 0.8}},
        }
    ).encode()
    env = write_code_location(tmp_path, version, base)
    lock = f"{cp.model_root(model)}/{cp.LOCK_NAME}"
    with s3_through_proxy() as proxy:
        store = blob_store(base)
        for ds in (DS1, DS2):
            d = f"{base}/models/{model.name}/{version}/{ds}"
            _attempt(store, d, "a1", {"metrics.json": report, "model.json": b"{}"})
            promote_attempt(store, d, "a1", extra={})
        proxy.deny("DELETE")
        instance = dg.DagsterInstance.ephemeral()
        warehouse = WarehouseResource(uri=base, s3=S3Resource(endpoint_url=proxy.url))
        result = dg.materialize(
            [build_champion_asset(model)],
            resources={"warehouse": warehouse, "mlflow": MlflowResource()},
            instance=instance,
        )
        assert result.success and proxy.denied >= 1
        (event,) = result.get_asset_materialization_events()
        md = event.event_specific_data.materialization.metadata  # type: ignore[union-attr]
        assert md["moved"].value is True, md["rejected"].value
        assert md["ds"].value == DS2
        assert md["left_behind"].value == [lock]
        warned = [
            e.user_message
            for e in instance.all_logs(result.run_id)
            if e.level == 30 and "champion lock could not be deleted" in e.user_message
        ]
        assert len(warned) == 1 and lock in warned[0] and "600s old" in warned[0], warned
        assert getattr(cp.read_champion(store, model), "ds", None) == DS2  # as Dagster says

        for argv, ds in (
            (["promote", model.name, "--ds", DS1], DS1),
            (["rollback", model.name], DS2),
        ):
            proxy.restore()
            store.delete(lock)  # a person clears it: breaking it needs the delete denied
            proxy.deny("DELETE")
            res = run_cli(*argv, "--module", "champ_defs", env=env)
            assert res.returncode == 0, res.stderr
            assert f"champion -> {version}/{ds}" in res.stderr
            assert f"warning: {model.name}'s champion lock could not be deleted: {lock}" in (
                res.stderr
            )
            assert json.loads(res.stdout)["ds"] == ds
            assert getattr(cp.read_champion(store, model), "ds", None) == ds


def test_the_cli_reads_storage_through_the_code_locations_warehouse(
    s3_bucket: str, s3_env: dict[str, str], tmp_path: Path
) -> None:
    """A code location whose warehouse resource names its S3 endpoint in code, in a shell
    whose AWS environment points elsewhere (a closed port): `backfill` plans, records and
    judges its model partitions, and `promote` and `rollback` move its champion, all on
    the storage its runs use, not on the one the environment names."""
    from zipline_dagster.storage.artifacts import promote_attempt

    version, base = "0123456789ab", f"{s3_bucket}/wh"
    model = gated(version, base)
    store = blob_store(base)  # the test's own view: the real endpoint
    report = json.dumps(
        {
            "train": {"rows": 300, "metrics": {"auc": 0.9}},
            "holdout": {"rows": 100, "metrics": {"auc": 0.8}},
        }
    ).encode()
    for ds in (DS1, DS2):
        d = f"{base}/models/{model.name}/{version}/{ds}"
        for name, data in (("metrics.json", report), ("model.json", b"{}")):
            store.write_bytes(f"{d}/_attempts/a1/{name}", data)
        # as training writes it: the trainer version and the declaration's code version
        extra = {"version": version, "code_version": model_code_version(model)}
        promote_attempt(store, d, "a1", extra=extra)
    (tmp_path / "s3_defs.py").write_text(
        textwrap.dedent(
            f"""
            from dagster_aws.s3 import S3Resource
            from tests.rollout.test_champion import gated
            from tests.support.training import resources
            from zipline_dagster.definitions import ExternalTable, build_definitions
            from zipline_dagster.storage.resources import WarehouseResource

            model = gated({version!r}, {base!r})
            warehouse = WarehouseResource(
                uri={base!r}, s3=S3Resource(endpoint_url={s3_env["AWS_ENDPOINT_URL"]!r})
            )
            defs = build_definitions(
                external_tables=[ExternalTable({TABLE!r})],
                models=[model],
                resources={{**resources(None, {base!r}), "warehouse": warehouse}},
                automation=False,
            )
            """
        )
    )
    home = tmp_path / "dagster_home"
    home.mkdir()
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    env = {
        "PYTHONPATH": f"{ROOT}:{tmp_path}",
        "DAGSTER_HOME": str(home),
        "AWS_ENDPOINT_URL": closed,
        "AWS_ENDPOINT_URL_S3": closed,
    }
    cli = ("--module", "s3_defs")

    # storage that cannot be read is named in the plan, not taken for "nothing there"
    from zipline_dagster.definitions import ExternalTable, build_definitions
    from zipline_dagster.lineage.freshness import FreshnessResolver
    from zipline_dagster.settings import StorageOptions

    graph = build_definitions(
        external_tables=[ExternalTable(TABLE)],
        models=[model],
        resources=resources(None, base),
        automation=False,
    ).resolve_asset_graph()
    unreadable = FreshnessResolver(
        dg.DagsterInstance.ephemeral(),
        graph,
        store=lambda uri: blob_store(uri, options=StorageOptions(s3_endpoint_url=closed)),
    )
    said = unreadable.status(model_asset_key(model.name), DS1)
    assert str(said).startswith("missing: its storage cannot be read ("), said

    planned = run_cli("backfill", model.name, "--start-ds", DS1, "--end-ds", DS2, *cli, env=env)
    # both committed on that storage: recorded from it, and nothing to train again
    assert planned.stdout.strip() == "backfill_id=none (every partition is fresh)", planned.stderr
    key = model_asset_key(model.name)
    for ds in (DS1, DS2):
        assert (
            f"note: {key.to_user_string()} {ds}: storage holds attempt a1, committed by no "
            "Dagster run, which ended without recording it"
        ) in planned.stderr, planned.stderr
    with dg.DagsterInstance.from_config(str(home)) as instance:
        for ds in (DS1, DS2):
            assert latest_materialization(instance, key, ds) is not None
        # its gates judged on that storage: the manifest's files re-read there
        gates = [
            dg.AssetCheckKey(key, "manifest_verifies"),
            dg.AssetCheckKey(key, "rollout_thresholds"),
        ]
        latest = instance.event_log_storage.get_latest_asset_check_execution_by_key(gates)
        assert {k.name: latest[k].status.value for k in gates} == dict.fromkeys(
            ("manifest_verifies", "rollout_thresholds"), "SUCCEEDED"
        )
    for argv, ds in (
        (["promote", model.name, "--ds", DS1], DS1),
        (["promote", model.name, "--ds", DS2], DS2),
        (["rollback", model.name], DS1),
    ):
        moved = run_cli(*argv, *cli, env=env)
        assert moved.returncode == 0, moved.stderr
        assert f"champion -> {version}/{ds}" in moved.stderr
        assert getattr(cp.read_champion(store, model), "ds", None) == ds
