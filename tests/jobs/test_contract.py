"""The typed contract between the platform and a job (``zipline_runtime.contract``): a
training invocation written as flags in one place and read by the runtime's parser, a
table read as a manifest records it, and a partition reference owning its folder and
display form."""

from __future__ import annotations

import argparse
import datetime as dt

import pytest
from zipline_runtime import trainer_io as tio
from zipline_runtime.contract import (
    ContractError,
    PartitionRef,
    ScoringInvocation,
    TableRead,
    TrainingInvocation,
)

from zipline_dagster import EventSource, InferenceSpec, Model, Query, TrainingSpec, Window
from zipline_dagster.declarations.model import ResourceConfig
from zipline_dagster.jobs.request import build_training_request
from zipline_dagster.storage.paths import model_dir_uri


def model(**conf: str) -> Model:
    return Model(
        version="a" * 12,
        model_artifact_base_uri="s3://b/ml",
        inference_spec=InferenceSpec(model_backend_params={"model_name": "m"}),
        training_conf=TrainingSpec(
            training_data_source=EventSource(
                table="ctr.t", query=Query(selects={"x": "x", "label": "label"})
            ),
            training_data_window=Window(length=3),
            resource_config=ResourceConfig(min_replica_count=2),
            job_configs={"label-column": "label", **conf},
        ),
    )


def test_a_training_invocation_is_written_once_and_the_runtime_reads_it_back() -> None:
    read = TableRead("ctr.t", "s3://b/wh/ctr/t/metadata/00003.metadata.json", 42)
    job = build_training_request(model(), "2026-07-10", warehouse="s3://b/wh", table=read)
    invocation = job.invocation
    assert list(job.flags) == invocation.to_flags()
    assert [f.split("=", 1)[0] for f in job.flags] == [
        "--input-table", "--start-ds", "--end-ds", "--model-dir", "--warehouse",
        "--table-metadata", "--snapshot-id", "--columns", "--num-workers", "--checkpoint-dir",
        "--label-column",
    ]  # fmt: skip
    parser = argparse.ArgumentParser()
    tio.add_platform_flags(parser)
    args, rest = parser.parse_known_args(job.flags)
    assert (args.input_table, args.start_ds, args.end_ds) == ("ctr.t", "2026-07-08", "2026-07-10")
    assert (args.table_metadata, args.snapshot_id) == (read.metadata, 42)
    assert args.model_dir == invocation.model_dir == "s3://b/ml/models/m/aaaaaaaaaaaa/2026-07-10"
    assert tio.column_list(args.columns) == ["x", "label"]
    assert rest == [
        "--num-workers=2",
        f"--checkpoint-dir={invocation.model_dir}/_checkpoints",
        "--label-column=label",
    ]
    # the manifest records it as written
    assert invocation.to_json()["read"] == {
        "table": "ctr.t",
        "metadata": read.metadata,
        "snapshot_id": 42,
    }
    # job_configs override what the platform derives, in place of it
    moved = build_training_request(model(**{"model-dir": "s3://b/elsewhere"}), "2026-07-10",
                                   warehouse="s3://b/wh").invocation  # fmt: skip
    assert moved.model_dir == "s3://b/elsewhere"
    assert ("checkpoint-dir", "s3://b/elsewhere/_checkpoints") in moved.options
    by_hand = TrainingInvocation(TableRead("ctr.t"), "2026-07-01", "2026-07-02", "/m", "/w")
    assert "--table-metadata" not in " ".join(by_hand.to_flags())


def test_a_scoring_invocation_names_its_day_model_and_output() -> None:
    flags = ScoringInvocation(
        TableRead("ctr.src", "m.json", 7), "2026-07-11", "s3://b/ml/models/m/v/2026-07-10",
        "ctr.scores", "s3://b/wh", ("view_id", "ts"),
    ).to_flags()  # fmt: skip
    parser = argparse.ArgumentParser()
    tio.add_inference_flags(parser)
    args = parser.parse_args(flags)
    assert (args.ds, args.output_table, args.write_id) == ("2026-07-11", "ctr.scores", "pending")
    assert (args.table_metadata, args.snapshot_id, args.passthrough) == ("m.json", 7, "view_id,ts")


def test_a_table_read_from_a_manifest_names_what_is_missing() -> None:
    assert TableRead.from_json(
        {"table": "ctr.t", "metadata": "m", "snapshot_id": 3}, where="x"
    ) == (TableRead("ctr.t", "m", 3))
    assert (
        TableRead.from_json({"table": "ctr.t", "snapshot_id": True}, where="x").snapshot_id is None
    )
    with pytest.raises(ContractError, match=r"the manifest of m 2026-07-10 records no input table"):
        TableRead.from_json({"metadata": "m"}, where="the manifest of m 2026-07-10")


def test_a_partition_reference_owns_its_folder_and_display_form() -> None:
    ref = PartitionRef.of("m", "a" * 12, "2026-07-10")
    assert ref.day == dt.date(2026, 7, 10) and ref.ds == "2026-07-10"
    assert ref.where == f"{'a' * 12}/2026-07-10"
    assert ref.uri("s3://b/ml/") == f"s3://b/ml/models/m/{'a' * 12}/2026-07-10"
    assert ref.uri("s3://b/ml") == model_dir_uri("s3://b/ml", "m", "a" * 12, "2026-07-10")
    assert PartitionRef.parse("m", ref.where) == ref
    for bad in ("2026-07-10", f"{'a' * 12}/yesterday", "/2026-07-10"):
        with pytest.raises(ContractError, match="names no partition|is not a day"):
            PartitionRef.parse("m", bad)
    manifest = {"model": "m", "version": "a" * 12, "ds": "2026-07-10"}
    assert PartitionRef.of_manifest(manifest, where="x") == ref
    with pytest.raises(ContractError, match=r"s3://x/_MANIFEST.json names no model, version"):
        PartitionRef.of_manifest({"model": "m"}, where="s3://x/_MANIFEST.json")


def test_a_report_is_written_and_read_in_one_place_each() -> None:
    from zipline_runtime.contract import parse_report, report_json, report_metrics

    report = {
        "train": {"rows": 30, "metrics": {"auc": 0.8, "logloss": None}},
        "holdout": {"rows": 0, "metrics": {"auc": None}},
        "status": {"holdout.auc": "empty split: the holdout set has no rows"},
    }
    data = report_json(report)  # type: ignore[arg-type]
    assert parse_report(data, where="m.json") == report
    assert report_metrics(parse_report(data, where="m.json")) == {
        "train_auc": 0.8,
        "train_logloss": None,
        "train_rows": 30.0,
        "holdout_auc": None,
        "holdout_rows": 0.0,
    }
    with pytest.raises(ContractError, match=r"s3://b/m/metrics.json is not valid JSON"):
        parse_report(b"{", where="s3://b/m/metrics.json")
    with pytest.raises(ContractError, match=r"m.json holds list, expected a JSON object"):
        parse_report(b"[]", where="m.json")
