"""Trainer support, its storage half, re-exported by ``zipline_runtime.trainer_io`` under
the names trainers use. Filesystems for local paths, ``file://``,
``s3://``, ``gs://`` and ``abfss://`` through fsspec (the platform's storage layer),
writing artifacts, and planning a window's files of an Iceberg table at the snapshot
the platform resolved. Standard library, fsspec, pyarrow and pyiceberg only.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import os
from typing import Any, NamedTuple
from urllib.parse import urlparse


def filesystem(uri: str) -> tuple[Any, str]:
    """An fsspec filesystem and the path inside it for ``uri`` (the platform's storage
    layer): local paths, ``file://``, ``s3://``, ``gs://``, ``abfss://``. Endpoints and
    credentials come from the job's environment, read by each SDK itself
    (``AWS_ENDPOINT_URL``, ``STORAGE_EMULATOR_HOST``, ``AZURE_STORAGE_CONNECTION_STRING``
    ...), which jobs inherit from the cluster."""
    import fsspec

    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        from fsspec.implementations.local import LocalFileSystem

        return LocalFileSystem(), os.path.abspath(parsed.path if parsed.scheme else uri)
    if parsed.scheme == "gs":  # the plain client (see zipline_dagster.storage.blobs)
        from gcsfs.core import GCSFileSystem

        fs: Any = GCSFileSystem(use_listings_cache=False)
        return fs, str(fs._strip_protocol(uri)).rstrip("/")
    fs, path = fsspec.url_to_fs(uri, use_listings_cache=False)
    return fs, str(path).rstrip("/")


def arrow_filesystem(uri: str) -> tuple[Any, str]:
    """``filesystem(uri)`` wrapped for pyarrow users (Ray Train's ``storage_filesystem``)."""
    import pyarrow.fs as pafs

    fs, path = filesystem(uri)
    return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), path


def join(uri: str, *parts: str) -> str:
    out = uri.rstrip("/")
    for p in parts:
        out = f"{out}/{p.strip('/')}"
    return out


def is_local(fs: Any) -> bool:
    """Whether ``fs`` (an fsspec filesystem) is the local disk."""
    protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    return "file" in protocols


def write_bytes(dir_uri: str, name: str, data: bytes) -> str:
    """Writes ``data`` as ``name`` in ``dir_uri``; its URI. A local folder is made as
    needed; an object store has no folders, and its bucket must exist (fsspec's makedirs
    would create a missing one: a mistyped bucket would become a new bucket)."""
    uri = join(dir_uri, name)
    fs, path = filesystem(uri)
    if is_local(fs):
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    # on GCS, data ending in CR goes as one resumable chunk: a multipart upload would
    # lose that CR (as the platform's storage.blobs.ObjectStore._pipe says)
    gcs_cr = uri.startswith("gs://") and data.endswith(b"\r")
    try:
        fs.pipe_file(path, data, **({"chunksize": len(data)} if gcs_cr else {}))
    except Exception as exc:  # each SDK raises its own types: the URI named in all
        lines = str(exc).strip().splitlines()
        text = f"could not write {uri}: {type(exc).__name__}: {lines[0] if lines else ''}"
        # a missing bucket or container: FileNotFoundError (s3fs, gcsfs), Azure's NotFound
        missing = isinstance(exc, FileNotFoundError) or "NotFound" in type(exc).__name__
        raise (FileNotFoundError(text) if missing else OSError(text)) from exc
    return uri


class TrainingDataError(RuntimeError):
    """The training window's data is missing, incomplete or lacks a requested column."""


#: The keys of an object store's file details that change whenever the object is written
#: again, in order of preference (S3's and Azure's ETag, GCS's generation).
_VERSION_KEYS = ("ETag", "etag", "generation", "md5Hash", "LastModified", "last_modified", "mtime")


def file_version(f: Any) -> tuple[Any, ...]:
    """What tells the version of an opened file: its size and, on an object store, the
    tag the open read (ETag, generation); of a local file, its inode and change times.
    Two opens of a file rewritten in between differ, even at the same size."""
    details = getattr(f, "details", None)  # object stores: the info the open made
    if isinstance(details, dict):
        tag = next((details[k] for k in _VERSION_KEYS if details.get(k) is not None), None)
        return (f.size, str(tag))
    try:
        st = os.fstat(f.fileno())
    except (AttributeError, OSError, ValueError):  # no descriptor (io.UnsupportedOperation
        return (f.size,)  # is both): the size alone
    return (st.st_size, st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)


#: A day computed with no rows: the table property the platform sets in the same commit.
EMPTY_DAY = "zipline.empty."


def iceberg_io_properties() -> dict[str, str]:
    """pyiceberg's FileIO for the job: fsspec's, whose SDKs read their endpoints and
    credentials from the job's environment themselves (as ``filesystem``)."""
    return {"py-io-impl": "pyiceberg.io.fsspec.FsspecFileIO"}


def newest_metadata(warehouse: str, table: str) -> str:
    """By hand, without ``--table-metadata``: the table's newest metadata file under its
    location (``{warehouse}/ns/name/metadata/NNNNN-....metadata.json``, as pyiceberg's SQL
    catalog writes them). The platform always passes ``--table-metadata``."""
    ns, name = table.split(".", 1)
    fs, path = filesystem(join(warehouse, ns, name, "metadata"))
    try:
        found = [str(p) for p in fs.ls(path, detail=False) if str(p).endswith(".metadata.json")]
    except FileNotFoundError:
        found = []
    if not found:
        raise TrainingDataError(
            f"table {table}: no Iceberg metadata under {join(warehouse, ns, name)}; pass "
            "--table-metadata (the platform always does)"
        )
    newest = max(found, key=lambda p: p.rsplit("/", 1)[-1])
    return f"file://{newest}" if is_local(fs) else str(fs.unstrip_protocol(newest))


class PlannedWindow(NamedTuple):
    """A window of an Iceberg table at a snapshot, from its metadata and manifests."""

    #: {day: its data files' URIs}
    files: dict[str, list[str]]
    #: the days marked empty (computed with no rows)
    empty: set[str]
    #: the table's top-level columns at the snapshot (its schema, not a file's footer)
    columns: list[str]
    #: {day: its rows}, the data files' record counts as the manifests hold them
    rows: dict[str, int]
    #: {column: its Arrow type at the snapshot}: what every file's column must be
    types: dict[str, Any]


def plan_window(
    metadata: str, snapshot_id: int | None, window: list[str], partition_column: str
) -> PlannedWindow:
    """``window``'s files, empty days and the table's columns at ``snapshot_id`` (None:
    the metadata's current snapshot), read from its metadata and manifests with
    pyiceberg."""
    from pyiceberg.table import StaticTable

    table = StaticTable.from_metadata(metadata, properties=iceberg_io_properties())
    snapshot = _snapshot(table, snapshot_id, metadata)
    wanted = {checked_day(d) for d in window}
    files: dict[str, list[str]] = {}
    rows: dict[str, int] = {}
    # the manifests whose day bounds (the first partition field's) hold a window day, and
    # their live entries of those days: pyiceberg's own scan would evaluate a residual
    # of `ds IN (...)` per file, most of a small window's read
    as_day = _partition_day(table, partition_column)
    # the manifest list read as the manifests are (pyiceberg's snapshot.manifests would
    # resolve its reader again)
    listed = (
        _avro_records(table.io, snapshot.manifest_list, "list")
        if snapshot is not None and snapshot.manifest_list
        else []
    )
    for manifest in listed:
        if not _may_hold(manifest, wanted, as_day):
            continue
        for entry in _live_entries(table.io, manifest.manifest_path):
            ds = as_day(entry.data_file.partition[0], False)
            if ds in wanted:
                files.setdefault(ds, []).append(entry.data_file.file_path)
                rows[ds] = rows.get(ds, 0) + entry.data_file.record_count
    empty = {k[len(EMPTY_DAY) :] for k in table.properties if k.startswith(EMPTY_DAY)}
    schema = table.schemas().get(snapshot.schema_id) if snapshot is not None else None
    return PlannedWindow(
        {d: sorted(f) for d, f in files.items()},
        empty & set(window),
        [field.name for field in (schema or table.schema()).fields],
        rows,
        _arrow_types(schema or table.schema()),
    )


def _arrow_types(schema: Any) -> dict[str, Any]:
    """{column: Arrow type} of an Iceberg schema, as pyiceberg maps it (strings and
    binaries as their large forms, which a file's plain ones are read as)."""
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    arrow = schema_to_pyarrow(schema, include_field_ids=False)
    return {field.name: field.type for field in arrow}


def _snapshot(table: Any, snapshot_id: int | None, metadata: str) -> Any:
    """The snapshot ``snapshot_id`` of ``table`` (None: its current one, None when it
    has none); an error naming it and the newest held when the table has no such one."""
    if snapshot_id is None:
        return table.current_snapshot()
    found = table.snapshot_by_id(snapshot_id)
    if found is None:
        # pyiceberg plans nothing at an unknown snapshot: say which, not "missing days"
        held = [s.snapshot_id for s in table.snapshots()][-5:]
        raise TrainingDataError(
            f"--snapshot-id={snapshot_id} is not a snapshot of {metadata} (expired by "
            f"maintenance?); it holds {len(table.snapshots())}, the newest {held}"
        )
    return found


def _may_hold(manifest: Any, days: set[str], as_day: Any) -> bool:
    """Whether a manifest's day bounds (its first partition field's) hold one of
    ``days``; True when it has none."""
    bounds = manifest.partitions[0] if manifest.partitions else None
    if bounds is None or not bounds.lower_bound or not bounds.upper_bound:
        return True
    low, high = as_day(bounds.lower_bound, True), as_day(bounds.upper_bound, True)
    return any(low <= d <= high for d in days)


#: {(what the reader reads, the file's Avro schema as its header holds it): (its Iceberg
#: schema, the reader of its records)}: every manifest (and manifest list) of a table is
#: written with the same schema
_AVRO_READERS: dict[tuple[str, str], tuple[Any, Any]] = {}


@functools.cache
def _header_reader() -> Any:
    """The reader of an Avro file's header (pyiceberg's ``AvroFile`` builds it per file)."""
    from pyiceberg.avro.file import META_SCHEMA, AvroFileHeader
    from pyiceberg.avro.resolver import construct_reader

    return construct_reader(META_SCHEMA, {-1: AvroFileHeader})


def _avro_records(io: Any, path: str, kind: str) -> list[Any]:
    """The records of the Avro file at ``path``, a manifest list (``kind="list"``) or a
    manifest (``"manifest"``), read as pyiceberg's ``read_manifest_list`` and
    ``ManifestFile.fetch_manifest_entry`` read them (less the latter's inheritance of
    snapshot ids, unused here). pyiceberg derives each file's Avro schema and resolves
    its reader again for every file (nearly all of planning a window committed a day at
    a time), and builds the header's reader each time too: both are kept here. Public pyiceberg names only."""
    from pyiceberg import manifest as m
    from pyiceberg.avro.decoder import new_decoder
    from pyiceberg.avro.file import AvroFile
    from pyiceberg.avro.resolver import resolve_reader

    if kind == "list":
        avro: Any = AvroFile[m.ManifestFile](
            io.new_input(path),
            m.MANIFEST_LIST_FILE_SCHEMAS[m.DEFAULT_READ_VERSION],
            read_types={-1: m.ManifestFile, 508: m.PartitionFieldSummary},
            read_enums={517: m.ManifestContent},
        )
    else:
        avro = AvroFile[m.ManifestEntry](
            io.new_input(path),
            m.MANIFEST_ENTRY_SCHEMAS[m.DEFAULT_READ_VERSION],
            read_types={-1: m.ManifestEntry, 2: m.DataFile},
            read_enums={0: m.ManifestEntryStatus, 101: m.FileFormat, 134: m.DataFileContent},
        )
    with avro.input_file.open() as f:  # as AvroFile.__enter__, less the schema's work
        avro.decoder = new_decoder(f.read())
    avro.header = _header_reader().read(avro.decoder)  # as AvroFile._read_header
    key = (kind, avro.header.meta.get("avro.schema", ""))
    if key not in _AVRO_READERS:
        schema = avro.header.get_schema()
        reader = resolve_reader(schema, avro.read_schema, avro.read_types, avro.read_enums)
        _AVRO_READERS[key] = (schema, reader)
    avro.schema, avro.reader = _AVRO_READERS[key]
    return list(avro)


def _live_entries(io: Any, path: str) -> list[Any]:
    """The live (not deleted) entries of the manifest file at ``path``."""
    from pyiceberg.manifest import ManifestEntryStatus

    return [
        e for e in _avro_records(io, path, "manifest") if e.status != ManifestEntryStatus.DELETED
    ]


def _partition_day(table: Any, partition_column: str) -> Any:
    """A function of (a value of the table's first partition field, ``partition_column``,
    whether it is a manifest's serialized bound) to the day it is (YYYY-MM-DD): a string,
    or a date (pyiceberg gives a date's value as days since 1970-01-01).

    Raises:
        TrainingDataError: the table is not partitioned by ``partition_column`` first.
    """
    from pyiceberg.conversions import from_bytes
    from pyiceberg.types import DateType

    fields = list(table.spec().fields)
    first = table.schema().find_column_name(fields[0].source_id) if fields else None
    if first != partition_column:
        raise TrainingDataError(
            f"the table at {table.metadata_location} is partitioned first by {first!r}, not "
            f"by {partition_column!r}: its days cannot be planned"
        )
    kind = table.schema().find_field(fields[0].source_id).field_type

    def as_day(value: Any, serialized: bool) -> str:
        if serialized:
            value = from_bytes(kind, value)
        if isinstance(kind, DateType) and isinstance(value, int):  # days since 1970-01-01
            value = dt.date(1970, 1, 1) + dt.timedelta(days=value)
        return value.isoformat() if isinstance(value, dt.date) else str(value)

    return as_day


def checked_day(value: str) -> str:
    """``value`` when it is a day (YYYY-MM-DD), else an argparse error naming it."""
    try:
        dt.date.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a day (YYYY-MM-DD)") from None
    return value
