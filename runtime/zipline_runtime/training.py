"""Trainer support: a reference trainer's window, split by date and read batch by batch.

``WindowTraining`` checks the window as a whole read did (missing days, no rows, the
label, the features), then feeds xgboost from record batches: the training matrix
(``stream.build_matrix``: in memory or external, as the memory budget says), the
holdout's predictions, a bounded sample for the drift reference and, for Ray Train,
the training days as a Ray Dataset that each worker reads its shard of. No step builds
a frame of the window. Trainers reach it as ``zipline_runtime.training``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
from collections.abc import Callable, Iterator
from typing import Any

from zipline_runtime import stats, stream
from zipline_runtime.tables import TrainingDataError


def _numeric(t: Any) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t))


def _dtype_name(t: Any) -> str:
    """An Arrow type named as pandas names its dtype (``object`` for strings)."""
    import numpy as np

    try:
        return np.dtype(t.to_pandas_dtype()).name
    except (NotImplementedError, TypeError):
        return str(t)


def binary_labels(table: str, column: str) -> Callable[[Any], None]:
    """A label check for classifiers: every label is 0 or 1."""

    def check(y: Any) -> None:
        bad = y[(y != 0) & (y != 1)]
        if len(bad):
            raise TrainingDataError(
                f"label column {column!r} of {table} holds {bad[0]:g}: a binary "
                "classifier's label is 0 or 1"
            )

    return check


class WindowTraining:
    """The window of a reference trainer's flags (``add_platform_flags`` and
    ``add_training_flags``), split by date: the ``--eval-days`` most recent days are
    the holdout. ``label_check`` sees each batch's labels (float64) and raises
    ``TrainingDataError`` for one that does not fit the task.

    Raises:
        TrainingDataError: a missing day, a window without rows, a label column that
            is absent or not a number, no feature, an empty training split.
    """

    def __init__(
        self, args: argparse.Namespace, *, label_check: Callable[[Any], None] | None = None
    ) -> None:
        from zipline_runtime import trainer_io as tio

        self.args = args
        window = tio.window_days(args.start_ds, args.end_ds)
        eval_days = min(args.eval_days, len(window))
        self.holdout_days = window[len(window) - eval_days :] if eval_days else []
        self.train_days = window[: len(window) - eval_days]
        self.stream = tio.flags_window_stream(args, args.batch_rows)
        self.stream.check()  # missing days, no rows: as a whole read fails
        types, table, label = self.stream.types, args.input_table, args.label_column
        if label not in types:
            raise TrainingDataError(
                f"label column {label!r} is not in {table}; columns: {sorted(types)}"
            )
        if not _numeric(types[label]):
            raise TrainingDataError(
                f"label column {label!r} of {table} is {_dtype_name(types[label])}, not "
                "numeric: a label is a number"
            )
        self.features = stream.feature_columns_of(
            types, args.features, label, args.partition_column
        )
        if not self.features:
            raise TrainingDataError(f"{table} has no numeric feature columns")
        self.columns = list(self.features.values())
        self.label_check = label_check
        self.train_rows = self.stream.rows(self.train_days)
        self.holdout_rows = self.stream.rows(self.holdout_days)
        if not self.train_rows:
            raise TrainingDataError(
                f"empty split: the training set is empty (window {window[0]}..{window[-1]}, "
                f"eval-days={args.eval_days} holds out {self.holdout_days}); widen the window "
                "or lower eval-days"
            )
        self.sample = stream.StridedSample(self.train_rows, self.columns)
        self._cache: str | None = None

    def days_with_rows(self, days: list[str]) -> list[str]:
        return [d for d in days if self.stream.rows([d])]

    def split_report(self, split: str, metrics: dict[str, Any]) -> dict[str, Any]:
        """The report's ``train`` or ``holdout``: its rows, its days' range, ``metrics``."""
        days = self.days_with_rows(self.train_days if split == "train" else self.holdout_days)
        return {
            "rows": self.train_rows if split == "train" else self.holdout_rows,
            "date_range": {"start": days[0], "end": days[-1]}
            if days
            else {"start": None, "end": None},
            "metrics": metrics,
        }

    def xy(self, days: list[str], sample: stream.StridedSample | None = None) -> Iterator[Any]:
        """``(x float32, y float64)`` of each batch of ``days``, labels checked."""
        import numpy as np

        label = self.args.label_column
        for _, batch in self.stream.batches([*self.columns, label], days):
            y = batch.column(label).to_numpy(zero_copy_only=False).astype(np.float64)
            if np.isnan(y).any():
                raise TrainingDataError(
                    f"label column {label!r} of {self.args.input_table} has "
                    f"{int(np.isnan(y).sum())} empty rows in a batch; every row needs a label"
                )
            if self.label_check is not None:
                self.label_check(y)
            if sample is not None:
                sample.add(batch)
            yield stream.as_matrix(batch, self.columns), y

    def matrix(self, xgb: Any, nthread: int) -> tuple[Any, stream.MatrixPlan]:
        """The training days' matrix, as the memory budget says; the drift sample is
        taken on its first pass."""
        passes = [0]

        def source() -> Iterator[Any]:
            passes[0] += 1
            return self.xy(self.train_days, self.sample if passes[0] == 1 else None)

        plan = stream.MatrixPlan.for_rows(
            self.train_rows, len(self.columns), self.args.memory_budget or None
        )
        m, self._cache = stream.build_matrix(
            xgb, source, plan, feature_names=list(self.features), nthread=nthread
        )
        return m, plan

    def predict(self, booster: Any, days: list[str]) -> tuple[Any, Any]:
        """``(labels, predictions)`` of ``days``, batch by batch. A pass over the training
        days takes the drift sample when no matrix built here took it (Ray Train's
        workers built theirs), so the window is not read once more for it."""
        import numpy as np

        untaken = days == self.train_days and not self.sample.seen
        ys, ps = [], []
        for x, y in self.xy(days, self.sample if untaken else None):
            ys.append(y)
            ps.append(booster.inplace_predict(x))
        if not ys:
            return np.array([]), np.array([], dtype=np.float32)
        return np.concatenate(ys), np.concatenate(ps)

    def drift_reference(self, predictions: Any) -> dict[str, Any]:
        """The report's ``drift_reference``: the training rows' sample (taken while the
        matrix was built or the training days predicted, else here) and the holdout
        predictions."""
        if not self.sample.seen:
            for _ in self.xy(self.train_days, self.sample):
                pass
        values = {n: self.sample.values(c) for n, c in self.features.items()}
        return stats.drift_reference_of(values, predictions)

    def fingerprint(self) -> str:
        """What the training rows are: the snapshot's files of the training days, the
        columns and the label (Iceberg data files never change in place)."""
        spec = {
            "files": self.stream.paths(self.train_days),
            "columns": self.columns,
            "label": self.args.label_column,
            "snapshot": self.stream.files.snapshot_id,
        }
        return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]

    def train_dataset(self) -> Any:
        """The training days as a Ray Dataset of the features and the label, for Ray
        Train's ``datasets=``: each worker reads its shard (``get_dataset_shard``). Its
        blocks are the snapshot's files of those days, one read task each, read batch by
        batch with ``WindowStream``'s checks. Read tasks hold no CPU: they run while the
        workers, which hold theirs, wait for their shards (a task asking for a CPU of
        its own would wait for one forever on a cluster the workers fill)."""
        import ray.data

        stream, columns = self.stream, [*self.columns, self.args.label_column]
        items = [{"day": ds, "path": p} for ds, p in stream.paths(self.train_days)]

        def read(files: Any) -> Iterator[Any]:
            import pyarrow as pa

            for ds, path in zip(files["day"].to_pylist(), files["path"].to_pylist(), strict=True):
                for batch in stream.file_batches(ds, path, columns):
                    yield pa.Table.from_batches([batch])

        return ray.data.from_items(items, override_num_blocks=len(items)).map_batches(
            read, batch_size=1, batch_format="pyarrow", num_cpus=0
        )

    def close(self) -> None:
        """Remove an external-memory cache."""
        if self._cache:
            shutil.rmtree(self._cache, ignore_errors=True)
            self._cache = None
