"""What the platform and a job both name, in one typed form each.

``PartitionRef``: one model partition (model, trainer version, day). It owns the
partition's folder (``{base}/models/{model}/{version}/{ds}``) and its display form
(``{version}/{ds}``, as messages, champion pointers and cards name it); nothing else
builds either, and nothing takes them apart again but ``PartitionRef.parse``.

``TableRead``, ``TrainingInvocation``, ``ScoringInvocation``: what a job is given, each
written as its flags in one place (``to_flags``; ``zipline_runtime.flags`` reads them).

``PartitionResult``: what a job's driver reports of each partition, written as a result
line in one place (``result_line``) and read in one (``partition_results``).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

#: A committed model partition's manifest, written last by the platform's promotion.
MANIFEST_NAME = "_MANIFEST.json"


class ContractError(ValueError):
    """A stored record does not hold what the contract says it does (names it)."""


def where(version: str, ds: str) -> str:
    """The display form of a partition (``PartitionRef.where``), for a record that holds
    a version and a day but not its model (a champion pointer's challenger)."""
    return f"{version}/{ds}"


@dataclass(frozen=True, order=True)
class PartitionRef:
    """A model partition: ``model``'s trainer ``version`` trained for ``day``."""

    model: str
    version: str
    day: dt.date

    @property
    def ds(self) -> str:
        """The day as Dagster's partition key (YYYY-MM-DD)."""
        return self.day.isoformat()

    @property
    def where(self) -> str:
        """``{version}/{ds}``: how messages, pointers and cards name it."""
        return where(self.version, self.ds)

    def uri(self, base: str) -> str:
        """``{base}/models/{model}/{version}/{ds}``: where its artifacts land."""
        return f"{base.rstrip('/')}/models/{self.model}/{self.version}/{self.ds}"

    @classmethod
    def of(cls, model: str, version: str, ds: str) -> PartitionRef:
        """The partition of ``model`` ``version`` on day ``ds`` (YYYY-MM-DD).

        Raises:
            ContractError: ``ds`` is not a day.
        """
        try:
            day = dt.date.fromisoformat(ds)
        except (TypeError, ValueError):
            raise ContractError(f"{ds!r} is not a day (YYYY-MM-DD)") from None
        return cls(model, version, day)

    @classmethod
    def parse(cls, model: str, where: str) -> PartitionRef:
        """The partition a stored display form (``{version}/{ds}``) names.

        Raises:
            ContractError: ``where`` is not of that form.
        """
        version, sep, ds = where.partition("/")
        if not sep or not version:
            raise ContractError(f"{where!r} names no partition; expected VERSION/YYYY-MM-DD")
        return cls.of(model, version, ds)

    @classmethod
    def of_manifest(cls, manifest: Mapping[str, Any], *, where: str) -> PartitionRef:
        """The partition a committed partition's manifest names (its ``model``,
        ``version`` and ``ds``, written by the platform when it promoted the attempt).

        Raises:
            ContractError: the manifest lacks one of them (names ``where``).
        """
        fields = [manifest.get(k) for k in ("model", "version", "ds")]
        if not all(isinstance(f, str) and f for f in fields):
            raise ContractError(
                f"{where} names no model, version and ds (found {fields}); a partition the "
                "platform committed always does"
            )
        return cls.of(*fields)  # type: ignore[arg-type]


@dataclass(frozen=True)
class TableRead:
    """Where a job reads its input table: the table, its Iceberg metadata file and the
    snapshot the platform resolved for its window (None: by hand, the newest)."""

    table: str
    metadata: str | None = None
    snapshot_id: int | None = None

    def flags(self) -> list[tuple[str, str]]:
        """Its flags after ``--input-table`` (the platform's; by hand: none)."""
        out = [("table-metadata", self.metadata)] if self.metadata else []
        if self.snapshot_id is not None:
            out.append(("snapshot-id", str(self.snapshot_id)))
        return out

    def to_json(self) -> dict[str, Any]:
        return {"table": self.table, "metadata": self.metadata, "snapshot_id": self.snapshot_id}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any], *, where: str) -> TableRead:
        """The read a manifest's ``input`` records.

        Raises:
            ContractError: it names no table (names ``where``).
        """
        table, snapshot = raw.get("table"), raw.get("snapshot_id")
        if not isinstance(table, str) or not table:
            raise ContractError(f"{where} records no input table (found {dict(raw)})")
        metadata = raw.get("metadata")
        return cls(
            table,
            str(metadata) if metadata else None,
            snapshot if isinstance(snapshot, int) and not isinstance(snapshot, bool) else None,
        )


@dataclass(frozen=True)
class TrainingInvocation:
    """What a training job is given, typed: written as the trainer's flags in one place
    (``to_flags``), and as the partition's manifest records it (``to_json``). The trainer
    reads the flags with ``zipline_runtime.flags``."""

    read: TableRead
    start_ds: str
    end_ds: str
    model_dir: str
    warehouse: str
    #: every other flag, in order: derived ones (``columns``, ``num-workers``,
    #: ``checkpoint-dir``) and the model's ``job_configs``
    options: tuple[tuple[str, str], ...] = ()

    def to_flags(self) -> list[str]:
        pairs = [
            ("input-table", self.read.table),
            ("start-ds", self.start_ds),
            ("end-ds", self.end_ds),
            ("model-dir", self.model_dir),
            ("warehouse", self.warehouse),
            *self.read.flags(),
            *self.options,
        ]
        return [f"--{k}={v}" for k, v in pairs]

    def to_json(self) -> dict[str, Any]:
        return {
            "read": self.read.to_json(),
            "start_ds": self.start_ds,
            "end_ds": self.end_ds,
            "model_dir": self.model_dir,
            "warehouse": self.warehouse,
            "options": [list(o) for o in self.options],
        }


@dataclass(frozen=True)
class ScoringInvocation:
    """What a scores day's job is given (the inference module's flags), typed."""

    read: TableRead
    ds: str
    model_dir: str
    output_table: str
    warehouse: str
    passthrough: tuple[str, ...] = ()
    #: names the file it writes; the launcher sets it to the attempt's id
    write_id: str = "pending"
    #: rows scored per batch and written per file (0: the runtime's default); passed
    #: only when set
    batch_rows: int = 0

    def to_flags(self) -> list[str]:
        pairs = [
            ("input-table", self.read.table),
            ("ds", self.ds),
            ("model-dir", self.model_dir),
            ("output-table", self.output_table),
            ("warehouse", self.warehouse),
            ("write-id", self.write_id),
            ("passthrough", ",".join(self.passthrough)),
            *self.read.flags(),
            *([("batch-rows", str(self.batch_rows))] if self.batch_rows else []),
        ]
        return [f"--{k}={v}" for k, v in pairs]


#: Prefix of the one line per partition a job's driver prints (and keeps in its end
#: marker): ``RESULT_PREFIX`` + the ``PartitionResult`` as JSON.
RESULT_PREFIX = "zipline-partition-result "


class PartitionResult(TypedDict, total=False):
    """What a job's driver reports of one partition's run (its result line)."""

    ds: str
    exit_code: int
    seconds: float
    #: CPU-seconds and peak resident memory of its run (where they could be measured)
    cpu_s: float
    peak_mem_mb: float
    #: a failed run's last lines of output
    tail: str


def result_line(result: PartitionResult) -> str:
    """The line the driver prints for ``result`` (the one writer of it)."""
    return RESULT_PREFIX + json.dumps(result, sort_keys=True)


def partition_results(logs: str) -> dict[str, PartitionResult]:
    """The result lines of a job's log (or of its end marker), by ds (the one reader)."""
    out: dict[str, PartitionResult] = {}
    for line in logs.splitlines():
        if line.startswith(RESULT_PREFIX):
            result: PartitionResult = json.loads(line[len(RESULT_PREFIX) :])
            out[str(result["ds"])] = result
    return out


#: A trained partition's report, beside its model (``metrics.json``).
REPORT_NAME = "metrics.json"
#: The report's splits: the days trained on, and the most recent days held out.
SPLITS = ("train", "holdout")


class SplitReport(TypedDict, total=False):
    """One split of a report: its rows, its first and last day, its metrics (a missing
    one is None, its reason in the report's ``status``)."""

    rows: int
    date_range: dict[str, str | None]
    metrics: dict[str, float | None]


class Report(TypedDict, total=False):
    """What a trainer reports of a partition (``metrics.json``): its splits with their
    metrics, a status per missing metric (``{split}.{metric}``: why), and the rest the
    platform shows (features and their importance, the PR curve, parameters, the drift
    reference, the runtime that ran it, distributed placement)."""

    model_type: str
    runtime: dict[str, Any]
    input_table: str
    window: dict[str, Any]
    split: dict[str, Any]
    train: SplitReport
    holdout: SplitReport
    status: dict[str, str]
    features: dict[str, str]
    feature_importance: list[dict[str, Any]]
    pr_curve: dict[str, list[float]] | None
    params: dict[str, Any]
    num_rounds: int
    training_seconds: float
    drift_reference: dict[str, Any]
    distributed: dict[str, Any] | None


def report_json(report: Report) -> bytes:
    """``report`` as a trainer writes it (the one writer of ``metrics.json``)."""
    return json.dumps(report, indent=2, sort_keys=True).encode()


def parse_report(data: bytes, *, where: str) -> Report:
    """A stored ``metrics.json`` (the one reader of it).

    Raises:
        ContractError: not JSON, or not an object (names ``where``).
    """
    try:
        raw = json.loads(data)
    except ValueError as exc:
        raise ContractError(f"{where} is not valid JSON ({type(exc).__name__}: {exc})") from None
    if not isinstance(raw, dict):
        raise ContractError(f"{where} holds {type(raw).__name__}, expected a JSON object")
    report: Report = raw  # type: ignore[assignment]
    return report


def report_metrics(report: Mapping[str, Any]) -> dict[str, float | None]:
    """``{split}_{key}`` -> value for every metric the report holds, and each split's
    ``rows`` (None where the report has no number for it): the names gates, the champion
    and the metadata use."""
    out: dict[str, float | None] = {}
    for split in SPLITS:
        part = report.get(split) or {}
        for key, raw in [*(part.get("metrics") or {}).items(), ("rows", part.get("rows"))]:
            ok = isinstance(raw, (int, float)) and not isinstance(raw, bool)
            if ok or key != "rows" or "rows" in part:
                out[f"{split}_{key}"] = float(raw) if ok else None
    return out
