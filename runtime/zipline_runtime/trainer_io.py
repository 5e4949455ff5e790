"""Trainer support: what trainers import from the runtime, so they share it, not copy it.

The runtime reaches every job beside the trainer's archive (the project pins it), and
run by hand from a project it is the installed ``zipline-runtime``. It holds the trainer
contract's shared half: the platform flags, the training window, reading committed table
partitions of an Iceberg table (the snapshot the platform resolved, planned by pyiceberg,
with the ``--columns`` projection) and writing artifacts, for local paths, ``file://``,
``s3://``, ``gs://`` and ``abfss://`` through fsspec. Its storage half (filesystems,
writing, planning a window from the table's manifests) is ``zipline_runtime.tables``, and
its numbers half (the metrics of a split, drift, xgboost imported without scikit-learn) is
``zipline_runtime.stats``, both re-exported here. Standard library, numpy, fsspec,
pyarrow and pyiceberg only.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from typing import Any

from zipline_runtime import flags as _flags
from zipline_runtime import stats as _stats
from zipline_runtime import stream as _stream
from zipline_runtime import tables as _tables
from zipline_runtime.contract import (
    MANIFEST_NAME,
    REPORT_NAME,
    ContractError,
    PartitionRef,
    report_json,
)

# the storage half (``trainer_tables``), under the names trainers use (``tio.filesystem``)
filesystem = _tables.filesystem
arrow_filesystem = _tables.arrow_filesystem
join = _tables.join
is_local = _tables.is_local
write_bytes = _tables.write_bytes
file_version = _tables.file_version
newest_metadata = _tables.newest_metadata
plan_window = _tables.plan_window
iceberg_io_properties = _tables.iceberg_io_properties
TrainingDataError = _tables.TrainingDataError
EMPTY_DAY = _tables.EMPTY_DAY
_day = _tables.checked_day
# the contract's flags (``flags``)
add_platform_flags = _flags.add_platform_flags
add_training_flags = _flags.add_training_flags
add_inference_flags = _flags.add_inference_flags
non_negative_int = _flags.non_negative_int
check_window = _flags.check_window
# the statistics half (``trainer_stats``): metrics of a split, drift, lean xgboost
import_xgboost = _stats.import_xgboost
accuracy = _stats.accuracy
log_loss = _stats.log_loss
roc_auc = _stats.roc_auc
precision_recall_curve = _stats.precision_recall_curve
rmse = _stats.rmse
mae = _stats.mae
r2 = _stats.r2
DRIFT_KEY = _stats.DRIFT_KEY
DRIFT_SAMPLE = _stats.DRIFT_SAMPLE
drift_reference = _stats.drift_reference
psi = _stats.psi
drift_of = _stats.drift_of
drift_reference_of = _stats.drift_reference_of
# the streaming half (``stream``): a window as record batches, xgboost fed from them
WindowStream = _stream.WindowStream
MatrixPlan = _stream.MatrixPlan
StridedSample = _stream.StridedSample
DriftCounts = _stream.DriftCounts
Spool = _stream.Spool
StagedDay = _stream.StagedDay
as_matrix = _stream.as_matrix
build_matrix = _stream.build_matrix
job_threads = _stream.job_threads
feature_columns_of = _stream.feature_columns_of
BATCH_ROWS = _stream.BATCH_ROWS


#: Requests in flight at once on an object store, where each one's time is mostly the
#: store's latency: the files' footers, the files' reads.
#: Local files are read one after another (pyarrow decodes each on every core already).
CONCURRENT_REQUESTS = 8


class WindowFiles:
    """The committed files of a window's partitions, listed once, to read in one go or
    column by column: a trainer can read a few columns first (say, to size its work and
    start its workers) and the others after, without listing the table again.

    ``columns`` (the platform's ``--columns``) is the projection: a read asks for it (or
    part of it), never for more; a projected column the table lacks fails here, naming it
    and what the table has. The days that have no files are ``missing`` (a read fails
    naming them). On an object store the days are listed, and the files read,
    ``CONCURRENT_REQUESTS`` at a time; what comes back is in the window's order either
    way, and an error is the first one in that order."""

    def __init__(
        self,
        warehouse: str,
        table: str,
        window: list[str],
        partition_column: str,
        columns: list[str],
        *,
        metadata: str | None = None,
        snapshot_id: int | None = None,
    ) -> None:
        ns, name = table.split(".", 1)
        self.fs, _ = filesystem(join(warehouse, ns, name))
        self.warehouse, self.table, self.window = warehouse, table, window
        self.partition_column, self.projection = partition_column, list(columns)
        self._concurrent = 1 if is_local(self.fs) else CONCURRENT_REQUESTS
        self.metadata = metadata or newest_metadata(warehouse, table)
        self.snapshot_id = snapshot_id
        planned = plan_window(self.metadata, snapshot_id, window, partition_column)
        #: the window as the manifests hold it: files, rows and the snapshot's types
        self.planned = planned
        self.days: list[tuple[str, list[str]]] = []
        self.missing: list[str] = []
        for ds in window:
            if planned.files.get(ds):
                self.days.append((ds, [filesystem(f)[1] for f in planned.files[ds]]))
            elif ds not in planned.empty:
                self.missing.append(ds)
        self._schema: Any = None
        #: each file's parquet footer and version (``file_version``), read with the file's
        #: first read and reused by the later reads of that same version
        self._footers: dict[str, tuple[Any, tuple[Any, ...]]] = {}
        # the projection against the table's schema at the snapshot (its metadata, no
        # file opened); a file without a column read is still named by its read
        absent = [c for c in self.projection if c not in planned.columns]
        if absent:
            raise TrainingDataError(
                f"table {table} has no columns {absent} (--columns); it has "
                f"{sorted(planned.columns)}"
            )

    def _files(self) -> list[tuple[str, str]]:
        """Every file of the present days, as ``(day, path)``, in the window's order."""
        return [(ds, path) for ds, files in self.days for path in files]

    def _map(self, fn: Any, items: list[Any]) -> list[Any]:
        """``fn`` of every item, in order: one after another on a local disk, else up to
        ``CONCURRENT_REQUESTS`` at once. An error is the first item's, in order, to fail."""
        if self._concurrent <= 1 or len(items) <= 1:
            return [fn(item) for item in items]
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(min(self._concurrent, len(items))) as pool:
            return list(pool.map(fn, items))

    def _footer(self, path: str) -> Any:
        import pyarrow.parquet as pq

        if path not in self._footers:
            with self.fs.open(path, "rb") as f:
                self._footers[path] = (pq.read_metadata(f), file_version(f))
        return self._footers[path][0]

    def _written_again(self, ds: str, path: str) -> TrainingDataError:
        return TrainingDataError(
            f"table {self.table} partition {ds} was written again while this job read it "
            f"({path} is gone or changed); run again"
        )

    def _require(self, ds: str, have: list[str], columns: list[str], flag: str) -> None:
        absent = [c for c in columns if c not in have]
        if absent:
            raise TrainingDataError(
                f"table {self.table} partition {ds} has no columns {absent} ({flag}); "
                f"it has {sorted(have)}"
            )

    @property
    def schema(self) -> Any:
        """The columns a read can ask for, as a pyarrow schema: the first file's, limited
        to the projection when there is one. Fails naming missing days."""
        import pyarrow as pa

        if self._schema is None:
            if self.missing:
                _check_window(self.warehouse, self.table, self.window, self.missing, 0)
            schema = self._footer(self.days[0][1][0]).schema.to_arrow_schema()
            if self.partition_column in schema.names:  # the day is not a column to read
                schema = schema.remove(schema.get_field_index(self.partition_column))
            if self.projection:
                schema = pa.schema([schema.field(c) for c in self.projection])
            self._schema = schema.remove_metadata()
        return self._schema

    def tables(
        self, columns: list[str] | None = None, dictionary: tuple[str, ...] = ()
    ) -> list[tuple[str, list[Any]]]:
        """The Arrow tables of each present day, as ``(day, tables)`` (one table per file):
        ``columns`` (None: the projection, else every column). ``dictionary``: string
        columns read dictionary-encoded (a segment column of few values, without a Python
        string per row later)."""
        import pyarrow.parquet as pq

        cols = self.projection if columns is None else list(columns)
        outside = [c for c in cols if self.projection and c not in self.projection]
        if outside:
            raise TrainingDataError(
                f"table {self.table}: columns {outside} are not read (--columns="
                f"{','.join(self.projection)}); add them to the projection"
            )
        wanted = [d for d in dictionary if not cols or d in cols] or None

        def read(job: tuple[str, str]) -> Any:
            ds, path = job
            try:
                with self.fs.open(path, "rb") as f:
                    version = file_version(f)
                    footer, first = self._footers.get(path, (None, version))
                    # rewritten in place since it was first read (under the same name,
                    # perhaps at the same size): neither its footer nor the rows an
                    # earlier read returned belong to what this read would return
                    if version != first:
                        raise self._written_again(ds, path)
                    parquet = pq.ParquetFile(
                        f,
                        metadata=footer,  # None: read now, with the file
                        read_dictionary=wanted,
                        pre_buffer=True,  # as read_table: ranges coalesced, fewer requests
                    )
                    self._footers[path] = (parquet.metadata, version)
                    # a file without a column asked for is an error naming it (a read
                    # would leave the column out, and that day's rows null in it)
                    self._require(ds, parquet.schema_arrow.names, cols, "asked for by the trainer")
                    return parquet.read(columns=cols or None)
            except FileNotFoundError:  # the day was written again since the listing
                raise self._written_again(ds, path) from None
            except OSError as exc:
                # s3fs's FileExpired: the object's ETag changed during this read
                if type(exc).__name__ == "FileExpired":
                    raise self._written_again(ds, path) from None
                raise

        read_back = iter(self._map(read, self._files()))
        return [(ds, [next(read_back) for _ in files]) for ds, files in self.days]

    def read_table(self, columns: list[str] | None = None, dictionary: tuple[str, ...] = ()) -> Any:
        """``columns`` (as ``tables``) of every row of the window as one pyarrow Table,
        for trainers that go to numpy without a pandas frame: the partition column is
        dictionary-encoded (a day per partition, not a string per row) and appended, and
        so are the ``dictionary`` columns; dictionaries are unified across files. Fails
        naming missing days, or a window without rows. Reads of different columns return
        the rows in the same order."""
        import numpy as np
        import pyarrow as pa

        tables = []
        for ds, files in self.tables(columns, dictionary):
            for t in files:
                if self.partition_column in t.column_names:  # the folder says which day
                    t = t.drop_columns([self.partition_column])
                # indices from numpy's zeroed buffer (cheaper than pa.repeat), all 0 and
                # so valid: not scanned again (safe=False)
                day = pa.DictionaryArray.from_arrays(
                    pa.array(np.zeros(len(t), dtype=np.int32)), pa.array([ds]), safe=False
                )
                tables.append(t.append_column(self.partition_column, day))
        rows = sum(len(t) for t in tables)
        _check_window(self.warehouse, self.table, self.window, self.missing, rows)
        return pa.concat_tables(tables, promote_options="permissive").unify_dictionaries()

    def read_frame(self) -> Any:
        """All rows (of the projection) as one pandas frame, the partition column a string
        per row; fails naming missing days, or a window without rows."""
        import pandas as pd

        frames = []
        for ds, tables in self.tables():
            frame = pd.concat([t.to_pandas() for t in tables], ignore_index=True)
            frame[self.partition_column] = ds
            frames.append(frame)
        data = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
        _check_window(self.warehouse, self.table, self.window, self.missing, len(data))
        return data


def _check_window(
    warehouse: str, table: str, window: list[str], missing: list[str], rows: int
) -> None:
    if missing:
        raise TrainingDataError(
            f"table {table} at {warehouse} is missing partitions "
            f"{', '.join(missing)} of the window {window[0]}..{window[-1]}"
        )
    if not rows:
        raise TrainingDataError(
            f"table {table}: the window {window[0]}..{window[-1]} has no rows "
            f"(empty partitions: {', '.join(window)})"
        )


def read_window(
    warehouse: str,
    table: str,
    window: list[str],
    partition_column: str,
    columns: list[str],
    *,
    metadata: str | None = None,
    snapshot_id: int | None = None,
) -> Any:
    """``WindowFiles.read_frame`` of the window's partitions."""
    return WindowFiles(
        warehouse,
        table,
        window,
        partition_column,
        columns,
        metadata=metadata,
        snapshot_id=snapshot_id,
    ).read_frame()


def read_flags_window(args: argparse.Namespace) -> Any:
    """``WindowFiles.read_frame`` of the platform flags."""
    return flags_window_files(args).read_frame()


def flags_window_files(args: argparse.Namespace) -> WindowFiles:
    """``WindowFiles`` of the platform flags: the table, its window, the projection."""
    return WindowFiles(
        args.warehouse,
        args.input_table,
        window_days(args.start_ds, args.end_ds),
        args.partition_column,
        column_list(args.columns),
        metadata=args.table_metadata,
        snapshot_id=args.snapshot_id,
    )


def flags_window_stream(args: argparse.Namespace, batch_rows: int = 0) -> _stream.WindowStream:
    """``WindowStream`` of the platform flags: the window read batch by batch."""
    return _stream.WindowStream(
        flags_window_files(args), batch_rows=batch_rows or _stream.BATCH_ROWS
    )


def report_header(args: argparse.Namespace, holdout_days: list[str]) -> dict[str, Any]:
    """The report's description of the data (table, window and the date split) and of the
    runtime the trainer ran with (its version and protocol)."""
    import zipline_runtime

    window = window_days(args.start_ds, args.end_ds)
    return {
        "runtime": {
            "version": zipline_runtime.__version__,
            "protocol": zipline_runtime.PROTOCOL_VERSION,
        },
        "input_table": args.input_table,
        "window": {"start": args.start_ds, "end": args.end_ds, "days": len(window)},
        "split": {
            "method": "date",
            "eval_days": args.eval_days,
            "train_days": [d for d in window if d not in holdout_days],
            "holdout_days": holdout_days,
        },
    }


def column_list(value: str) -> list[str]:
    return [c.strip() for c in value.split(",") if c.strip()]


def window_days(start: str, end: str) -> list[str]:
    """Every day from ``start`` to ``end``, inclusive (the platform's window)."""
    d0, d1 = dt.date.fromisoformat(start), dt.date.fromisoformat(end)
    return [(d0 + dt.timedelta(n)).isoformat() for n in range((d1 - d0).days + 1)]


def feature_columns(data: Any, spec: str, label: str, partition_column: str) -> dict[str, str]:
    """{feature name: column} of a frame's columns (``--features``: ``name`` or
    ``name:column`` items). Default: every numeric column but the label and partition.

    Raises:
        TrainingDataError: ``spec`` names a column the frame does not have.
    """
    import pandas as pd

    if spec:
        out = {}
        for item in spec.split(","):
            name, _, col = item.strip().partition(":")
            out[name] = col or name
        missing = [c for c in out.values() if c not in data.columns]
        if missing:
            raise TrainingDataError(
                f"--features names columns {missing} that the table does not have; "
                f"it has {sorted(data.columns)}"
            )
        return out
    return {
        c: c
        for c in data.columns
        if c not in (label, partition_column) and pd.api.types.is_numeric_dtype(data[c])
    }


def run_main(train: Any, argv: Any = None, *, succeeded: Any = lambda report: True) -> int:
    """A trainer's ``main``: log to stdout (the platform streams it), run ``train(argv)``,
    exit 2 on a training data error (named in the log), 1 when ``succeeded`` says no."""
    import logging
    import sys

    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stdout,
    )
    try:
        report = train(argv)
    except TrainingDataError as exc:
        logging.getLogger("trainer").error("training data error: %s", exc)
        return 2
    return 0 if succeeded(report) else 1


def write_report(model_dir: str, report: Any) -> str:
    """Write the partition's report (``metrics.json``: ``contract.Report``) into
    ``model_dir``, as the platform reads it; its URI."""
    return write_bytes(model_dir, REPORT_NAME, report_json(report))


def committed_partition(model_dir: str) -> PartitionRef:
    """The model partition committed at ``model_dir``, as its manifest names it.

    Raises:
        TrainingDataError: no manifest there (not a committed partition), or one that
            names no partition.
    """
    fs, path = filesystem(model_dir)
    where = join(model_dir, MANIFEST_NAME)
    try:
        manifest = json.loads(fs.cat_file(f"{path}/{MANIFEST_NAME}"))
    except FileNotFoundError:
        raise TrainingDataError(
            f"{model_dir} holds no {MANIFEST_NAME}: not a committed model partition"
        ) from None
    try:
        return PartitionRef.of_manifest(manifest, where=where)
    except ContractError as exc:
        raise TrainingDataError(str(exc)) from None


def write_table_file(
    warehouse: str,
    table: str,
    ds: str,
    write_id: str,
    frame: Any,
    *,
    drift: dict[str, Any] | None = None,
) -> str:
    """Stage ``frame`` as day ``ds``'s file of this write, for the platform to commit into
    the Iceberg table (``{table}/_staging/{write id}/_ds={ds}/``; readers see it only once
    committed). The file holds the ``ds`` column, as Iceberg's identity partition needs;
    ``drift`` (``drift_of``) goes into the file's key-value metadata (``DRIFT_KEY``),
    where the platform reads it with the scores."""
    import pyarrow as pa

    staged = _stream.StagedDay(warehouse, table, ds, write_id)
    staged.add(pa.Table.from_pandas(frame, preserve_index=False))
    return staged.close(drift=drift)[0]
