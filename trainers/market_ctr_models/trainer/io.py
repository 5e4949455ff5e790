"""Reading the training table and writing artifacts, for local paths, file:// and s3://."""

from __future__ import annotations

import json
import os
from typing import Any
from urllib.parse import urlparse


def filesystem(uri: str) -> tuple[Any, str]:
    """A pyarrow filesystem and the path inside it for ``uri``."""
    import pyarrow.fs as pafs

    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        return pafs.LocalFileSystem(), os.path.abspath(parsed.path if parsed.scheme else uri)
    if parsed.scheme == "s3":
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        kwargs: dict[str, Any] = {}
        if endpoint:
            ep = urlparse(endpoint)
            kwargs["endpoint_override"] = ep.netloc or endpoint
            kwargs["scheme"] = ep.scheme or "https"
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        if region:
            kwargs["region"] = region
        return pafs.S3FileSystem(**kwargs), parsed.netloc + parsed.path
    fs, path = pafs.FileSystem.from_uri(uri)
    return fs, path


def join(uri: str, *parts: str) -> str:
    out = uri.rstrip("/")
    for p in parts:
        out = f"{out}/{p.strip('/')}"
    return out


def write_bytes(dir_uri: str, name: str, data: bytes) -> str:
    fs, path = filesystem(join(dir_uri, name))
    parent = path.rsplit("/", 1)[0]
    fs.create_dir(parent, recursive=True)
    with fs.open_output_stream(path) as f:
        f.write(data)
    return join(dir_uri, name)


#: A partition's commit marker: the data files of its current version (the platform
#: writes new files first and swaps this marker last, so a reader sees the old version or
#: the new one, never a mix). ``"files": null`` marks a first write still in progress.
COMMIT_NAME = "_COMMITTED.json"


class TrainingDataError(RuntimeError):
    """The training window's data is missing, incomplete or lacks a requested column."""


def partition_files(fs: Any, directory: str) -> list[str]:
    """The committed parquet files of one partition folder; [] when it has none.

    With a commit marker, exactly the files it lists; without one (a table written by
    another system), every parquet file in the folder.
    """
    import pyarrow.fs as pafs

    marker = f"{directory}/{COMMIT_NAME}"
    if fs.get_file_info(marker).type == pafs.FileType.File:
        with fs.open_input_stream(marker) as f:
            listed = json.loads(f.read()).get("files")
        return [f"{directory}/{name}" for name in listed] if listed is not None else []
    info = fs.get_file_info(directory)
    if info.type != pafs.FileType.Directory:
        return []
    selector = pafs.FileSelector(directory, recursive=False)
    return sorted(
        f.path
        for f in fs.get_file_info(selector)
        if f.type == pafs.FileType.File and f.path.endswith(".parquet")
    )


def read_partitions(
    warehouse: str, table: str, window: list[str], partition_column: str, columns: list[str]
) -> tuple[list[Any], list[str]]:
    """One frame per present partition of the window (with the partition column) and
    the days that are missing. ``columns`` (the platform's ``--columns``) projects the
    read; a column the table lacks fails, naming it and what the table has."""
    import pandas as pd
    import pyarrow.parquet as pq

    ns, name = table.split(".", 1)
    fs, root = filesystem(join(warehouse, ns, name))
    frames, missing = [], []
    for ds in window:
        files = partition_files(fs, f"{root}/{partition_column}={ds}")
        if not files:
            missing.append(ds)
            continue
        parts = []
        for path in files:
            if columns:
                have = pq.read_schema(path, filesystem=fs).names
                absent = [c for c in columns if c not in have]
                if absent:
                    raise TrainingDataError(
                        f"table {table} partition {ds} has no columns {absent} (--columns); "
                        f"it has {sorted(have)}"
                    )
            parts.append(pq.read_table(path, filesystem=fs, columns=columns or None).to_pandas())
        part = pd.concat(parts, ignore_index=True)
        part[partition_column] = ds
        frames.append(part)
    return frames, missing


def column_list(value: str) -> list[str]:
    return [c.strip() for c in value.split(",") if c.strip()]
