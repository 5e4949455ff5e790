"""Trainer support at scale: a window streamed as Arrow record batches, and xgboost fed
from them, so that no process holds a frame of the whole window.

* ``WindowStream`` reads a window's files (``trainer_io.WindowFiles``: the snapshot the
  platform resolved, the ``--columns`` projection) one record batch at a time, each
  file's columns checked against the snapshot's schema; ``rows`` comes from the
  manifests, before anything is read.
* ``BatchIter`` is an ``xgboost.DataIter`` over such a stream; ``build_matrix`` turns it
  into a ``QuantileDMatrix`` (each pass reads the files again: what stays in memory is
  the quantized matrix), or into an ``ExtMemQuantileDMatrix`` cached on local disk when
  the quantized matrix would exceed the memory budget. ``MatrixPlan`` says which and why.
* ``StridedSample`` keeps every k-th row of a stream: the bounded sample the drift
  reference is built from (the same rows the whole-frame stride took).
* ``Spool`` writes a stream once to a node-local Arrow file and reads it back batch by
  batch: a Ray Train worker's shard, read once from Ray Data and passed over many times.
* ``DriftCounts`` measures a scored day's drift batch by batch (the same PSI as
  ``stats.drift_of`` over the whole day).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from zipline_runtime import stats
from zipline_runtime.tables import TrainingDataError

#: Rows per record batch read: a batch of 8 float features is a few MB.
BATCH_ROWS = 262_144
#: Bytes a quantized matrix holds per row beyond one byte per feature: its row pointer,
#: and the gradient pair and prediction cache training keeps for every row.
ROW_OVERHEAD_BYTES = 24


def job_threads(requested: int) -> int:
    """Threads for xgboost: ``requested`` when > 0, else the CPUs this process was given
    (``OMP_NUM_THREADS``, which Ray sets to a task's CPUs, else the CPU affinity)."""
    if requested > 0:
        return requested
    omp = os.environ.get("OMP_NUM_THREADS", "")
    if omp.isdigit() and int(omp) > 0:
        return int(omp)
    return max(1, len(os.sched_getaffinity(0)))


def feature_columns_of(
    types: dict[str, Any], spec: str, label: str, partition_column: str
) -> dict[str, str]:
    """``feature_columns`` of a table's columns as the snapshot types them (``{column:
    Arrow type}``, in order): without ``--features``, every integer, float or boolean
    column but the label and partition."""
    import pyarrow as pa

    if spec:
        out = {}
        for item in spec.split(","):
            name, _, col = item.strip().partition(":")
            out[name] = col or name
        missing = [c for c in out.values() if c not in types]
        if missing:
            raise TrainingDataError(
                f"--features names columns {missing} that the table does not have; "
                f"it has {sorted(types)}"
            )
        return out
    numeric = (pa.types.is_integer, pa.types.is_floating, pa.types.is_boolean)
    return {
        c: c
        for c, t in types.items()
        if c not in (label, partition_column) and any(is_(t) for is_ in numeric)
    }


def _kind(t: Any) -> str:
    """A type's family as a reader sees it: the string and binary forms are one."""
    import pyarrow as pa

    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return "binary"
    if pa.types.is_timestamp(t):
        return "timestamp"
    if pa.types.is_integer(t):  # Iceberg promotes int to long: an older file's int32
        return "integer"
    if pa.types.is_floating(t):  # and float to double
        return "floating"
    return str(t)


class WindowStream:
    """A window's files (``WindowFiles``) read as a stream of Arrow record batches.

    ``files.missing`` days, or a window without rows, fail here with the errors a whole
    read gives (``stream.check()``); a file whose column asked for is missing or of
    another type than the snapshot's fails naming the table, the file and the column."""

    def __init__(self, files: Any, *, batch_rows: int = BATCH_ROWS) -> None:
        self.files, self.batch_rows = files, batch_rows
        projection = files.projection or list(files.planned.types)
        #: {column: Arrow type at the snapshot} of the projection, in its order
        self.types: dict[str, Any] = {
            c: files.planned.types[c] for c in projection if c in files.planned.types
        }
        self._all_types: dict[str, Any] = files.planned.types
        self._rows: dict[str, int] = files.planned.rows

    @property
    def table(self) -> str:
        return str(self.files.table)

    def rows(self, days: list[str] | None = None) -> int:
        """Rows of ``days`` (None: the window), from the manifests."""
        wanted = self.files.window if days is None else days
        return sum(self._rows.get(d, 0) for d in wanted)

    def check(self) -> None:
        """Fail as a whole read does: missing days, or a window without rows."""
        from zipline_runtime.trainer_io import _check_window

        f = self.files
        _check_window(f.warehouse, f.table, f.window, f.missing, self.rows())

    def column_type(self, column: str) -> Any:
        """``column``'s Arrow type at the snapshot."""
        return self.types[column]

    def paths(self, days: list[str] | None = None) -> list[tuple[str, str]]:
        """``(day, path)`` of every file of ``days`` (None: the window), in order."""
        wanted = set(self.files.window if days is None else days)
        return [(ds, p) for ds, paths in self.files.days if ds in wanted for p in paths]

    def _check_file(self, path: str, schema: Any, columns: list[str]) -> None:
        names = schema.names
        for c in columns:
            want = self._all_types.get(c)
            if c not in names:
                raise TrainingDataError(
                    f"table {self.table}: file {path} has no column {c!r} that the snapshot's "
                    f"schema has ({want}); it has {sorted(names)}"
                )
            got = schema.field(c).type
            if want is not None and _kind(got) != _kind(want):
                raise TrainingDataError(
                    f"table {self.table}: file {path} holds column {c!r} as {got}, the "
                    f"snapshot's schema has it as {want}"
                )

    def check_files(self, columns: list[str], days: list[str] | None = None) -> None:
        """Every file of ``days`` holds ``columns`` as the snapshot types them (their
        footers read, not their rows): what a reader that is not ``batches`` needs."""
        import pyarrow.parquet as pq

        for ds, path in self.paths(days):
            try:
                with self.files.fs.open(path, "rb") as f:
                    self._check_file(path, pq.read_schema(f), columns)
            except FileNotFoundError:
                raise self.files._written_again(ds, path) from None

    def batches(
        self, columns: list[str], days: list[str] | None = None
    ) -> Iterator[tuple[str, Any]]:
        """``(day, record batch)`` of ``columns`` over ``days`` (None: the window), file by
        file, ``batch_rows`` rows at most each."""
        for ds, path in self.paths(days):
            yield from ((ds, b) for b in self.file_batches(ds, path, columns))

    def file_batches(self, ds: str, path: str, columns: list[str]) -> Iterator[Any]:
        """The record batches of ``columns`` of one file of day ``ds``, checked."""
        import pyarrow.parquet as pq

        try:
            with self.files.fs.open(path, "rb") as f:
                parquet = pq.ParquetFile(f, pre_buffer=True)
                self._check_file(path, parquet.schema_arrow, columns)
                yield from parquet.iter_batches(self.batch_rows, columns=columns)
        except FileNotFoundError:  # the day was written again since the listing
            raise self.files._written_again(ds, path) from None


def as_matrix(batch: Any, columns: list[str]) -> Any:
    """``columns`` of a record batch as one float32 array (rows x columns), nulls as NaN
    (xgboost's missing value)."""
    import numpy as np

    out = np.empty((batch.num_rows, len(columns)), dtype=np.float32)
    for i, c in enumerate(columns):
        col = batch.column(c)
        out[:, i] = col.to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
    return out


@dataclass(frozen=True)
class MatrixPlan:
    """How a training matrix is held, and why: in memory (``QuantileDMatrix``) or, when
    the quantized matrix would exceed the budget, in an external-memory cache on the
    node's local disk (``ExtMemQuantileDMatrix``)."""

    kind: str
    rows: int
    features: int
    estimated_bytes: int
    budget_bytes: int | None
    reason: str

    @classmethod
    def for_rows(cls, rows: int, features: int, budget_bytes: int | None) -> MatrixPlan:
        need = rows * (features + ROW_OVERHEAD_BYTES)
        if budget_bytes and need > budget_bytes:
            return cls(
                "external_memory", rows, features, need, budget_bytes,
                f"the quantized matrix (about {need:,} bytes) exceeds the memory budget "
                f"({budget_bytes:,} bytes): cached on local disk",
            )  # fmt: skip
        why = (
            f"the quantized matrix (about {need:,} bytes) fits the memory budget "
            f"({budget_bytes:,} bytes)"
            if budget_bytes
            else "no memory budget set"
        )
        return cls("in_memory", rows, features, need, budget_bytes, why)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "rows": self.rows,
            "features": self.features,
            "estimated_bytes": self.estimated_bytes,
            "budget_bytes": self.budget_bytes,
            "reason": self.reason,
        }


def batch_iter(
    xgb: Any, source: Callable[[], Iterator[tuple[Any, Any]]], cache_prefix: str | None
) -> Any:
    """An ``xgboost.DataIter`` whose every pass is ``source()``: ``(x, y)`` batches."""

    class BatchIter(xgb.DataIter):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            self._it: Iterator[tuple[Any, Any]] | None = None
            self.passes = 0
            super().__init__(cache_prefix=cache_prefix, release_data=True)

        def next(self, input_data: Callable[..., None]) -> bool:
            if self._it is None:
                self._it = source()
            item = next(self._it, None)
            if item is None:
                return False
            x, y = item
            input_data(data=x, label=y)
            return True

        def reset(self) -> None:
            self._it = None
            self.passes += 1

    return BatchIter()


def build_matrix(
    xgb: Any,
    source: Callable[[], Iterator[tuple[Any, Any]]],
    plan: MatrixPlan,
    *,
    feature_names: list[str],
    nthread: int,
    cache_dir: str | None = None,
) -> tuple[Any, Any]:
    """The training matrix of ``source``'s batches as ``plan`` says; ``(matrix, its
    cache folder or None)`` (the caller removes the folder when done)."""
    if plan.kind == "external_memory":
        folder = tempfile.mkdtemp(prefix="zipline-extmem-", dir=cache_dir)
        it = batch_iter(xgb, source, os.path.join(folder, "cache"))
        m = xgb.ExtMemQuantileDMatrix(it, nthread=nthread)
        m.feature_names = feature_names
        return m, folder
    m = xgb.QuantileDMatrix(batch_iter(xgb, source, None), nthread=nthread)
    m.feature_names = feature_names
    return m, None


class StridedSample:
    """Every ``k``-th row of a stream of ``total`` rows (k: ``total`` over ``size``,
    rounded up), as the whole-frame stride ``values[::k]`` would take them."""

    def __init__(self, total: int, columns: list[str], size: int = stats.DRIFT_SAMPLE) -> None:
        self.k = max(1, -(-total // size))
        self.columns = columns
        self._seen = 0
        self._parts: dict[str, list[Any]] = {c: [] for c in columns}

    def add(self, batch: Any) -> None:
        first = (-self._seen) % self.k  # the first row of this batch on the stride
        for c in self.columns:
            values = batch.column(c).to_numpy(zero_copy_only=False)
            self._parts[c].append(values[first :: self.k].astype(float))
        self._seen += batch.num_rows

    @property
    def seen(self) -> int:
        """Rows of the stream seen so far (0: the sample is not taken)."""
        return self._seen

    def values(self, column: str) -> Any:
        import numpy as np

        parts = self._parts[column]
        return np.concatenate(parts) if parts else np.array([], dtype=float)


class DriftCounts:
    """A scored day's drift (``stats.drift_of``), counted batch by batch against the
    model's reference histograms."""

    def __init__(self, reference: dict[str, Any] | None, features: dict[str, str]) -> None:
        self.reference = reference or {}
        refs = self.reference.get("features") or {}
        self._features = {n: c for n, c in features.items() if refs.get(n)}
        self._counts: dict[str, Any] = {}
        self._present: set[str] = set()

    def add(self, batch: Any, scores: Any) -> None:
        if not self.reference:
            return
        refs = self.reference.get("features") or {}
        for n, c in self._features.items():
            if c in batch.schema.names:
                self._present.add(n)
                self._count(n, refs[n], batch.column(c).to_numpy(zero_copy_only=False))
        if self.reference.get("predictions"):
            self._count("\0predictions", self.reference["predictions"], scores)

    def _count(self, key: str, reference: dict[str, Any], values: Any) -> None:
        import numpy as np

        v = np.asarray(values, dtype=float)
        v = v[np.isfinite(v)]
        edges = np.asarray(reference["edges"])
        counts = np.bincount(np.searchsorted(edges, v, side="right"), minlength=len(edges) + 1)
        self._counts[key] = self._counts.get(key, 0) + counts

    def result(self) -> dict[str, Any]:
        if not self.reference:
            return {}
        refs = self.reference.get("features") or {}
        out = {
            n: value
            for n in self._features
            if n in self._present
            and (value := stats.psi_of_counts(refs[n], self._counts.get(n))) is not None
        }
        return {
            "features": out,
            "predictions": stats.psi_of_counts(
                self.reference.get("predictions"), self._counts.get("\0predictions")
            ),
        }


class Spool:
    """A stream written once to a node-local Arrow IPC file, read back batch by batch
    (never mapped whole): a shard read once, passed over as often as xgboost asks."""

    def __init__(self, dir: str | None = None) -> None:
        self.folder = tempfile.mkdtemp(prefix="zipline-shard-", dir=dir)
        self.path = os.path.join(self.folder, "shard.arrow")
        self._writer: Any = None
        self._sink: Any = None
        self.schema: Any = None
        self.rows = 0

    def write(self, batch: Any) -> None:
        import pyarrow as pa

        if self._writer is None:
            self.schema = batch.schema
            self._sink = pa.OSFile(self.path, "wb")
            self._writer = pa.ipc.new_file(self._sink, batch.schema)
        elif not batch.schema.equals(self.schema):  # another file's int32, say
            batch = batch.cast(self.schema)
        self._writer.write_batch(batch)
        self.rows += batch.num_rows

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._sink.close()
            self._writer = None

    def batches(self) -> Iterator[Any]:
        import pyarrow as pa

        if not self.rows:
            return
        with pa.OSFile(self.path, "rb") as f:
            reader = pa.ipc.open_file(f)
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i)

    def remove(self) -> None:
        import shutil

        self.close()
        shutil.rmtree(self.folder, ignore_errors=True)


#: Rows of a staged scores file: a day larger than this is written as several files.
FILE_ROWS = 1_048_576


class StagedDay:
    """Day ``ds``'s files of a write, staged for the platform to commit into the Iceberg
    table in one transaction (``{table}/_staging/{write id}/_ds={ds}/part-NNNNN.parquet``;
    readers see them only once committed). Tables are added batch by batch; a file holds
    up to ``file_rows`` rows (a batch is never split), and every file the ``ds`` column
    Iceberg's identity partition needs. The last file carries the day's ``drift`` in its
    key-value metadata (``stats.DRIFT_KEY``), where the platform reads it."""

    def __init__(
        self, warehouse: str, table: str, ds: str, write_id: str, *, file_rows: int = FILE_ROWS
    ) -> None:
        from zipline_runtime.tables import join

        ns, name = table.split(".", 1)
        self.folder = join(warehouse, ns, name, "_staging", write_id, f"_ds={ds}")
        self.ds, self.file_rows = ds, max(1, file_rows)
        self._pending: list[Any] = []
        self._pending_rows = 0
        self.uris: list[str] = []
        self.rows = 0
        self.batches = 0

    def add(self, table: Any) -> None:
        """Stage ``table``'s rows (the ``ds`` column is added here)."""
        if self._pending and self._pending_rows + table.num_rows > self.file_rows:
            self._flush(None)
        self._pending.append(table)
        self._pending_rows += table.num_rows
        self.rows += table.num_rows
        self.batches += 1

    def _flush(self, drift: dict[str, Any] | None) -> None:
        import io
        import json

        import pyarrow as pa
        import pyarrow.parquet as pq

        from zipline_runtime.tables import write_bytes

        arrow = pa.concat_tables(self._pending, promote_options="permissive")
        arrow = arrow.append_column("ds", pa.array([self.ds] * arrow.num_rows, pa.string()))
        if drift:
            kv = {
                **(arrow.schema.metadata or {}),
                stats.DRIFT_KEY: json.dumps(drift, sort_keys=True),
            }
            arrow = arrow.replace_schema_metadata(kv)
        buf = io.BytesIO()
        pq.write_table(arrow, buf, coerce_timestamps="us", allow_truncated_timestamps=True)
        name = f"part-{len(self.uris):05d}.parquet"
        self.uris.append(write_bytes(self.folder, name, buf.getvalue()))
        self._pending, self._pending_rows = [], 0

    def close(self, *, drift: dict[str, Any] | None = None) -> list[str]:
        """Write what is pending (with ``drift``; a day without rows is one empty file);
        the staged files' URIs, in order."""
        if self._pending or not self.uris:
            if not self._pending:
                import pyarrow as pa

                self._pending = [pa.table({})]
            self._flush(drift)
        return self.uris
