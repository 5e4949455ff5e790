"""The core publishes its events to whatever listener the definitions wire in as
``mlflow`` (``events.PlatformListener``), never importing one: here a listener that is
not MLflow gets a partition trained, its gates judged and its champion evaluated, in
real materializations (the local launcher), and what it returns lands in their
metadata."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dagster as dg

from tests.helpers import days_ending, write_table
from tests.support.champion import DS1, advance, checks_of, gated, train
from tests.support.training import TABLE, resources
from zipline_dagster.events import (
    ChampionEvaluated,
    PartitionJudged,
    PartitionTrained,
    PlatformListener,
)
from zipline_dagster.jobs.archive import publish_trainer_archive
from zipline_dagster.storage.blobs import BlobStore


class _Recorder:
    def __init__(self, path: str) -> None:
        self.path = path

    def _write(self, **line: Any) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(line) + "\n")

    def partition_trained(self, event: PartitionTrained) -> dict[str, Any]:
        self._write(event="trained", ds=event.ds, attempt=event.attempt, files=list(event.files))
        return {"recorded_by": dg.MetadataValue.text("recording listener")}

    def partition_judged(self, event: PartitionJudged) -> None:
        self._write(
            event="judged", ds=event.ds, gates={n: ok for n, (ok, _) in event.gates.items()}
        )

    def champion_evaluated(self, event: ChampionEvaluated) -> dict[str, Any]:
        pointer = event.pointer
        assert pointer is not None
        gates = event.judged(pointer.version, pointer.ds)
        self._write(
            event="champion",
            ds=pointer.ds,
            moved=event.moved,
            passed=all(ok for ok, _ in gates.values()),
            attempt_gone=event.attempt_gone(pointer),
        )
        return {"recorded_by": dg.MetadataValue.text("recording listener")}


class RecordingListener(PlatformListener):
    """What it is told, one JSON line an event (Dagster builds resources again from their
    config, so what it heard goes to a file)."""

    path: str

    def listening(
        self,
        warn: Callable[[str], None],
        info: Callable[[str], None],
        store: Callable[[str], BlobStore],
    ) -> _Recorder:
        return _Recorder(self.path)


def test_a_listener_hears_a_partition_trained_judged_and_made_champion(
    file_base: str, trainer_copy: Path, tmp_path: Path
) -> None:
    write_table(file_base, TABLE, days_ending(DS1, 6), rows=400)
    version = publish_trainer_archive(
        trainer_copy, model_name="listing_ctr_model", base=file_base
    ).version
    model = gated(version, file_base)
    heard = tmp_path / "heard.jsonl"
    res = {**resources(None, file_base), "mlflow": RecordingListener(path=str(heard))}
    instance = dg.DagsterInstance.ephemeral()

    trained = train(model, res, DS1, instance)
    assert trained.success
    assert all(e.passed for e in checks_of(trained).values())
    (mat,) = trained.get_asset_materialization_events()
    md = mat.event_specific_data.materialization.metadata  # type: ignore[union-attr]
    assert md["recorded_by"].value == "recording listener"
    champion = advance(model, res, instance)
    assert champion["moved"] is True and champion["recorded_by"] == "recording listener"

    lines = [json.loads(line) for line in heard.read_text().splitlines()]
    assert [line["event"] for line in lines] == ["trained", "judged", "champion"]
    first, judged, moved = lines
    assert first["ds"] == DS1 and first["attempt"] and "model.json" in first["files"]
    assert judged["gates"] == {
        "rollout_thresholds": True,
        "report_complete": True,
        "manifest_verifies": True,
    }
    assert moved == {
        "event": "champion",
        "ds": DS1,
        "moved": True,
        "passed": True,
        "attempt_gone": False,
    }
