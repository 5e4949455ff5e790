"""Blob storage for archives, artifacts and tables: ``file://``, ``s3://``, ``gs://``, ``abfss://``.

Built on fsspec (s3fs, gcsfs, adlfs): one maintained, URI-dispatching layer with an
exclusive create in every backend (``pipe_file(mode="create")``: ``If-None-Match: *`` on
S3 and Azure, ``ifGenerationMatch=0`` on GCS), whose filesystems pandas, pyarrow and Ray
Train accept as they are, so the platform and the trainers share one layer
(``pyarrow.fs`` has no conditional write and ignores ``AWS_ENDPOINT_URL``).

Clients are configured by :class:`StorageOptions` (from :mod:`zipline_dagster.settings`
or the warehouse resource): an S3 endpoint and region, a GCS endpoint (an emulator), an
Azure connection string. Credentials come from each SDK's standard environment.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from zipline_dagster.settings import SCHEMES, StorageOptions, settings
from zipline_dagster.storage.blob_base import CHUNK as CHUNK
from zipline_dagster.storage.blob_base import BlobNotFoundError as BlobNotFoundError
from zipline_dagster.storage.blob_base import BlobStorageError as BlobStorageError
from zipline_dagster.storage.blob_base import BlobStore as BlobStore
from zipline_dagster.storage.blob_base import chunks_of, digest_of, unsupported_of


def local_path(uri: str) -> Path:
    """``file:///a/b`` -> ``/a/b``."""
    parsed = urlparse(uri)
    if parsed.scheme != "file" or parsed.netloc not in ("", "localhost"):
        raise BlobStorageError(f"{uri!r} is not a local file:/// URI")
    return Path(unquote(parsed.path))


def file_uri(path: str | os.PathLike[str]) -> str:
    """``/a/b`` -> ``file:///a/b``, unescaped, so Hive folders stay ``ds=YYYY-MM-DD``."""
    return "file://" + Path(path).resolve().as_posix()


def _is_temp(name: str) -> bool:
    return name.startswith(".") and name.endswith(".tmp")


def _written(chunks: Any, out: Any) -> Any:
    """``chunks``, each written to ``out`` as it passes."""
    for chunk in chunks:
        out.write(chunk)
        yield chunk


@contextlib.contextmanager
def _local_write(uri: str) -> Iterator[None]:
    """The disk's refusal of a write inside (a folder that cannot be made, no permission,
    no space) as this module's error, naming the URI and the reason."""
    try:
        yield
    except BlobStorageError:
        raise
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        raise BlobStorageError(f"could not write {uri}: {exc.strerror or exc}{where}") from None


class LocalStore:
    """``file://`` URIs on the local disk; writes are atomic (temp file + rename)."""

    def write_bytes(self, uri: str, data: bytes) -> None:
        path = local_path(uri)
        with _local_write(uri):
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.replace(tmp, path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise

    def read_bytes(self, uri: str) -> bytes:
        path = local_path(uri)
        try:
            return path.read_bytes()
        except FileNotFoundError as exc:
            raise BlobNotFoundError(f"no object at {uri} (no such file {path})") from exc

    def exists(self, uri: str) -> bool:
        return local_path(uri).is_file()

    def list(self, prefix_uri: str) -> list[str]:
        root = local_path(prefix_uri)
        if not root.is_dir():
            return []
        return sorted(file_uri(p) for p in root.rglob("*") if p.is_file() and not _is_temp(p.name))

    def stamps(self, prefix_uri: str) -> dict[str, str]:
        out = {}
        for uri in self.list(prefix_uri):
            try:
                st = os.stat(local_path(uri))
            except FileNotFoundError:  # removed since it was listed
                continue
            # a write replaces the file (a new inode); a change in place moves its mtime
            out[uri] = f"{st.st_size}:{st.st_ino}:{st.st_mtime_ns}"
        return out

    def delete(self, uri: str) -> None:
        local_path(uri).unlink(missing_ok=True)

    def move(self, src: str, dst: str) -> None:
        target = local_path(dst)
        with _local_write(dst):
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.replace(local_path(src), target)
            except FileNotFoundError as exc:
                raise BlobNotFoundError(f"no object at {src}") from exc

    def copy(self, src: str, dst: str) -> tuple[str, int]:
        source, target = local_path(src), local_path(dst)
        try:
            fin = source.open("rb")
        except FileNotFoundError as exc:  # before any folder is made for the copy
            raise BlobNotFoundError(f"no object at {src} (no such file {source})") from exc
        with fin, _local_write(dst):
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as fout:
                    landed = digest_of(_written(chunks_of(fin), fout))
                os.replace(tmp, target)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        return landed

    def sha256(self, uri: str) -> tuple[str, int]:
        path = local_path(uri)
        try:
            with open(path, "rb") as f:
                return digest_of(chunks_of(f))
        except FileNotFoundError as exc:
            raise BlobNotFoundError(f"no object at {uri} (no such file {path})") from exc

    def create_exclusive(self, uri: str, data: bytes) -> bool:
        path = local_path(uri)
        with _local_write(uri):
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        return True


def blob_store(uri: str, *, options: StorageOptions | None = None) -> BlobStore:
    """The store for ``uri``'s scheme.

    Raises:
        BlobStorageError: the scheme is not supported (names it and what is).
    """
    scheme = urlparse(uri).scheme
    if scheme == "file":
        return LocalStore()
    if scheme in SCHEMES:
        if options is None:
            options = settings().storage_options
        from zipline_dagster.storage.object_store import ObjectStore, object_filesystem

        return ObjectStore(scheme, object_filesystem(scheme, options))
    raise unsupported_of(uri)
