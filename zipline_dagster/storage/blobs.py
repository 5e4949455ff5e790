"""Blob storage for archives and artifacts: ``file://`` (embedded default) and ``s3://``.

``s3://`` goes through dagster-aws's client construction; the endpoint and credentials
come from the standard AWS environment (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID`` ...)
or from an explicit client, e.g. ``S3Resource(endpoint_url=...).get_client()``.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote, urlparse


class BlobStorageError(RuntimeError):
    """A blob storage operation failed; the message names the URI."""


class BlobNotFoundError(BlobStorageError, FileNotFoundError):
    """No object at the URI."""


class BlobStore(Protocol):
    def write_bytes(self, uri: str, data: bytes) -> None: ...
    def read_bytes(self, uri: str) -> bytes: ...
    def exists(self, uri: str) -> bool: ...
    def list(self, prefix_uri: str) -> list[str]:
        """Full URIs of every object below ``prefix_uri`` (recursive), sorted."""
        ...

    def delete(self, uri: str) -> None: ...
    def move(self, src: str, dst: str) -> None:
        """Move one object (a rename locally, copy + delete on S3)."""
        ...

    def create_exclusive(self, uri: str, data: bytes) -> bool:
        """Write ``data`` only if nothing is at ``uri``; False when something already is.

        The one atomic primitive locks are built on (``O_EXCL`` locally, a conditional
        put ``If-None-Match: *`` on S3).
        """
        ...


def local_path(uri: str) -> Path:
    """``file:///a/b`` -> ``/a/b``."""
    parsed = urlparse(uri)
    if parsed.scheme != "file" or parsed.netloc not in ("", "localhost"):
        raise BlobStorageError(f"{uri!r} is not a local file:/// URI")
    return Path(unquote(parsed.path))


def file_uri(path: str | os.PathLike[str]) -> str:
    """``/a/b`` -> ``file:///a/b``, unescaped, so Hive folders stay ``ds=YYYY-MM-DD``."""
    return "file://" + Path(path).resolve().as_posix()


class LocalStore:
    """``file://`` URIs on the local disk; writes are atomic (temp file + rename)."""

    def write_bytes(self, uri: str, data: bytes) -> None:
        path = local_path(uri)
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
        return sorted(
            file_uri(p)
            for p in root.rglob("*")
            if p.is_file() and not (p.name.startswith(".") and p.name.endswith(".tmp"))
        )

    def delete(self, uri: str) -> None:
        local_path(uri).unlink(missing_ok=True)

    def move(self, src: str, dst: str) -> None:
        target = local_path(dst)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(local_path(src), target)
        except FileNotFoundError as exc:
            raise BlobNotFoundError(f"no object at {src}") from exc

    def create_exclusive(self, uri: str, data: bytes) -> bool:
        path = local_path(uri)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return True


def _split_s3(uri: str) -> tuple[str, str]:
    parsed = urlparse(uri)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise BlobStorageError(f"{uri!r} is not an s3://bucket/key URI")
    return parsed.netloc, parsed.path.lstrip("/")


def default_s3_client(endpoint_url: str | None = None) -> Any:
    """A boto3 S3 client built by dagster-aws from the standard AWS environment."""
    from dagster_aws.s3.utils import construct_s3_client

    from zipline_dagster.settings import settings

    env = settings()
    return construct_s3_client(
        max_attempts=5,
        endpoint_url=endpoint_url or env.s3_endpoint_url,
        region_name=env.aws_region,
    )


class S3Store:
    """``s3://bucket/key`` URIs; any S3-compatible endpoint."""

    def __init__(self, client: Any | None = None) -> None:
        self._client = client

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = default_s3_client()
        return self._client

    def _err(self, action: str, uri: str, exc: Exception) -> BlobStorageError:
        return BlobStorageError(f"could not {action} {uri}: {type(exc).__name__}: {exc}")

    def write_bytes(self, uri: str, data: bytes) -> None:
        bucket, key = _split_s3(uri)
        try:
            self.client.put_object(Bucket=bucket, Key=key, Body=data)
        except Exception as exc:  # botocore raises many types; name the URI in all cases
            raise self._err("write", uri, exc) from exc

    def read_bytes(self, uri: str) -> bytes:
        bucket, key = _split_s3(uri)
        try:
            return bytes(self.client.get_object(Bucket=bucket, Key=key)["Body"].read())
        except Exception as exc:
            if _is_not_found(exc):
                raise BlobNotFoundError(f"no object at {uri}") from exc
            raise self._err("read", uri, exc) from exc

    def exists(self, uri: str) -> bool:
        bucket, key = _split_s3(uri)
        try:
            self.client.head_object(Bucket=bucket, Key=key)
            return True
        except Exception as exc:
            if _is_not_found(exc):
                return False
            raise self._err("check", uri, exc) from exc

    def list(self, prefix_uri: str) -> list[str]:
        bucket, prefix = _split_s3(prefix_uri)
        prefix = prefix.rstrip("/") + "/" if prefix else ""
        out: list[str] = []
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(
                Bucket=bucket, Prefix=prefix
            ):
                # Keys ending in "/" are folder markers some writers (pyarrow) create.
                out.extend(
                    f"s3://{bucket}/{o['Key']}"
                    for o in page.get("Contents", [])
                    if not o["Key"].endswith("/")
                )
        except Exception as exc:
            raise self._err("list", prefix_uri, exc) from exc
        return sorted(out)

    def delete(self, uri: str) -> None:
        bucket, key = _split_s3(uri)
        try:
            self.client.delete_object(Bucket=bucket, Key=key)
        except Exception as exc:
            raise self._err("delete", uri, exc) from exc

    def move(self, src: str, dst: str) -> None:
        sb, sk = _split_s3(src)
        db, dk = _split_s3(dst)
        try:
            self.client.copy_object(Bucket=db, Key=dk, CopySource={"Bucket": sb, "Key": sk})
        except Exception as exc:
            if _is_not_found(exc):
                raise BlobNotFoundError(f"no object at {src}") from exc
            raise self._err("move", src, exc) from exc
        self.delete(src)

    def create_exclusive(self, uri: str, data: bytes) -> bool:
        bucket, key = _split_s3(uri)
        try:
            self.client.put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
            return True
        except Exception as exc:
            code = str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))
            if code in {"PreconditionFailed", "412", "ConditionalRequestConflict", "409"}:
                return False
            raise self._err("create", uri, exc) from exc


def _is_not_found(exc: Exception) -> bool:
    code = str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))
    return code in {"404", "NoSuchKey", "NotFound"}


_UNSUPPORTED = {
    "gs": "gs:// needs a GCS client (gcsfs/google-cloud-storage), which this installation "
    "does not include; Ray itself can still fetch gs:// working_dirs on a cluster that has it",
    "abfss": "abfss:// needs an Azure client (adlfs), which this installation does not include",
}


def blob_store(uri: str, *, s3_client: Any | None = None) -> BlobStore:
    """The store for ``uri``'s scheme.

    Raises:
        BlobStorageError: the scheme is not supported here (names it and what is).
    """
    scheme = urlparse(uri).scheme
    if scheme == "file":
        return LocalStore()
    if scheme == "s3":
        return S3Store(s3_client)
    if scheme in _UNSUPPORTED:
        raise BlobStorageError(f"cannot use {uri}: {_UNSUPPORTED[scheme]}; use file:// or s3://")
    raise BlobStorageError(
        f"cannot use {uri!r}: unknown scheme {scheme!r}; accepted: file://, s3:// "
        "(gs:// and abfss:// need extra clients)"
    )
