"""Reading the training table and writing artifacts, for local paths, file:// and s3://."""

from __future__ import annotations

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


def partition_files(fs: Any, directory: str) -> list[str]:
    """The parquet files of one partition folder; [] when the folder is absent."""
    import pyarrow.fs as pafs

    info = fs.get_file_info(directory)
    if info.type != pafs.FileType.Directory:
        return []
    selector = pafs.FileSelector(directory, recursive=False)
    return sorted(
        f.path
        for f in fs.get_file_info(selector)
        if f.type == pafs.FileType.File and f.path.endswith(".parquet")
    )
