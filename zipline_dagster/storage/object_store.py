"""The object stores behind ``storage.blobs`` (``s3://``, ``gs://``, ``abfss://``): an
fsspec filesystem configured from :class:`StorageOptions`, and the :class:`BlobStore` on
it (``ObjectStore``), made by ``storage.blobs.blob_store``."""

from __future__ import annotations

import contextlib
import errno
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

from zipline_dagster.settings import StorageOptions
from zipline_dagster.storage.blob_base import (
    CHUNK,
    BlobNotFoundError,
    BlobStorageError,
    chunks_of,
    digest_of,
    unsupported_of,
)


def object_filesystem(scheme: str, options: StorageOptions | None = None) -> Any:
    """The fsspec filesystem for an object-store scheme, configured by ``options``.

    Listings are never cached: other processes (trainers, concurrent runs) write too.
    """
    opts = options or StorageOptions()
    if scheme == "s3":
        import s3fs

        client_kwargs = {"region_name": opts.aws_region} if opts.aws_region else {}
        return s3fs.S3FileSystem(
            endpoint_url=opts.s3_endpoint_url,
            client_kwargs=client_kwargs,
            use_listings_cache=False,
        )
    if scheme == "gs":
        # The plain client: gcsfs's default (experimental) one probes a storage-layout
        # API before each bucket's first use, which emulators do not serve.
        from gcsfs.core import GCSFileSystem

        if opts.gcs_endpoint_url:
            return GCSFileSystem(
                endpoint_url=opts.gcs_endpoint_url, token="anon", use_listings_cache=False
            )
        return GCSFileSystem(use_listings_cache=False)
    if scheme == "abfss":
        import adlfs

        return adlfs.AzureBlobFileSystem(
            connection_string=opts.azure_connection_string, use_listings_cache=False
        )
    raise unsupported_of(f"{scheme}://")


#: Longest wait for an Azure server copy (a move or a promotion's copy) to finish.
AZURE_COPY_WAIT_S = 600.0

#: An S3 object is first read as its first this many bytes: one GET, where s3fs's
#: ``cat_file`` sends a HEAD for the size before its GET. Commit markers, manifests,
#: reports and pointers are far smaller; a larger object is then read whole as s3fs
#: reads it (a GET, or concurrent ranges past its 50 MB block).
S3_FIRST_READ = 1 << 20


class ObjectStore:
    """``s3://bucket/key``, ``gs://bucket/key`` and ``abfss://container@host/key`` on fsspec.

    Object writes are atomic by nature (an object appears whole or not at all).
    """

    def __init__(self, scheme: str, fs: Any) -> None:
        self.scheme = scheme
        self.fs = fs

    def _path(self, uri: str) -> str:
        parsed = urlparse(uri)
        if parsed.scheme != self.scheme or not parsed.netloc:
            raise BlobStorageError(f"{uri!r} is not a {self.scheme}://bucket/key URI")
        return str(self.fs._strip_protocol(uri)).rstrip("/")

    def _uri(self, path: str, like: str) -> str:
        """The URI of ``path`` (as the filesystem lists it), in the form of ``like``."""
        parsed = urlparse(like)
        root_uri = f"{parsed.scheme}://{parsed.netloc}"
        root_path = str(self.fs._strip_protocol(root_uri)).rstrip("/")
        return root_uri + path[len(root_path) :]

    def _err(self, action: str, uri: str, exc: Exception) -> BlobStorageError:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return BlobStorageError(f"could not {action} {uri}: {type(exc).__name__}: {first}")

    def _pipe(self, path: str, data: bytes, **kw: Any) -> None:
        """``pipe_file``. On GCS an object ending in CR goes as a resumable upload: gcsfs
        ends a multipart upload's data with a bare LF before the closing delimiter, and a
        server that reads that CR LF as the delimiter's line break (RFC 2046; the GCS
        emulator does) stores the object without its last byte."""
        if self.scheme == "gs" and data.endswith(b"\r"):
            kw["chunksize"] = len(data)  # one chunk: the resumable path at any size
        self.fs.pipe_file(path, data, **kw)

    def write_bytes(self, uri: str, data: bytes) -> None:
        path = self._path(uri)
        try:
            self._pipe(path, data)
        except Exception as exc:  # each SDK raises its own types; name the URI in all
            if self._holds(uri, data):  # it landed; only the answer was lost
                return
            raise self._err("write", uri, exc) from exc

    def _holds(self, uri: str, data: bytes) -> bool:
        """Whether the object at ``uri`` holds exactly ``data`` (False when it cannot be
        read): after a write that failed, whether it landed all the same."""
        try:
            return self.read_bytes(uri) == data
        except Exception:
            return False

    @contextlib.contextmanager
    def _reading(self, action: str, uri: str) -> Iterator[None]:
        """The SDK's errors inside, as this module's: a missing object, or one naming
        ``uri`` and what was being done."""
        try:
            yield
        except FileNotFoundError as exc:
            raise BlobNotFoundError(f"no object at {uri}") from exc
        except BlobStorageError:
            raise
        except Exception as exc:
            raise self._err(action, uri, exc) from exc

    def read_bytes(self, uri: str) -> bytes:
        with self._reading("read", uri):
            if self.scheme == "s3":
                return self._read_s3(self._path(uri))
            return bytes(self.fs.cat_file(self._path(uri)))

    def _s3_head_bytes(self, path: str, n: int) -> bytes | None:
        """The first ``n`` bytes of an S3 object in one ranged GET; None for an empty
        object (S3 answers any range of it with 416, which s3fs raises as EINVAL). A
        missing one raises FileNotFoundError, as a whole read would."""
        try:
            return bytes(self.fs.cat_file(path, start=0, end=n))
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            return None

    def _read_s3(self, path: str) -> bytes:
        """One ranged GET (``S3_FIRST_READ`` bytes) for an object smaller than that; a
        larger one, or an empty one, is then read whole."""
        first = self._s3_head_bytes(path, S3_FIRST_READ)
        if first is not None and len(first) < S3_FIRST_READ:
            return first
        return bytes(self.fs.cat_file(path))

    def _isfile(self, path: str) -> bool:
        """Whether an object is at ``path``. On S3 one request: a GET of its first byte,
        where s3fs's ``isfile`` follows a HEAD that finds nothing with a listing (is it a
        folder?). A look for an absent object (a lock, the end marker of a running job,
        looked for every few seconds) is the common case."""
        if self.scheme != "s3":
            return bool(self.fs.isfile(path))
        try:
            self._s3_head_bytes(path, 1)
        except FileNotFoundError:
            return False
        return True

    def exists(self, uri: str) -> bool:
        try:
            return self._isfile(self._path(uri))
        except BlobStorageError:
            raise
        except Exception as exc:
            raise self._err("check", uri, exc) from exc

    def _find(self, prefix_uri: str) -> dict[str, dict[str, Any]]:
        """{path: the listing's details} of every object below ``prefix_uri``."""
        try:
            found = self.fs.find(self._path(prefix_uri) + "/", detail=True)
        except FileNotFoundError:
            return {}
        except Exception as exc:
            raise self._err("list", prefix_uri, exc) from exc
        # Keys ending in "/" are folder markers some writers create.
        return {p: info for p, info in found.items() if not p.endswith("/")}

    def list(self, prefix_uri: str) -> list[str]:
        return sorted(self._uri(p, prefix_uri) for p in self._find(prefix_uri))

    #: the listing's field that changes whenever an object is written, by store (GCS's
    #: etag changes with metadata-only updates too; its generation only with the bytes)
    STAMP_FIELDS = ("generation", "ETag", "etag")

    def stamps(self, prefix_uri: str) -> dict[str, str]:
        out = {}
        for path, info in self._find(prefix_uri).items():
            tag = next((info[k] for k in self.STAMP_FIELDS if info.get(k)), None)
            if tag is None:  # an SDK without any of them: refuse rather than guess
                raise BlobStorageError(
                    f"could not list {prefix_uri}: the {self.scheme} listing of {path} has none "
                    f"of {', '.join(self.STAMP_FIELDS)} (fields: {', '.join(sorted(info))})"
                )
            out[self._uri(path, prefix_uri)] = f"{info.get('size')}:{str(tag).strip(chr(34))}"
        return dict(sorted(out.items()))

    def delete(self, uri: str) -> None:
        try:
            self.fs.rm_file(self._path(uri))
        except FileNotFoundError:
            pass
        except BlobStorageError:
            raise
        except Exception as exc:
            raise self._err("delete", uri, exc) from exc

    def _server_copy(self, src: str, dst: str, action: str) -> None:
        with self._reading(action, src):
            self.fs.copy(self._path(src), self._path(dst))
            if self.scheme == "abfss":
                self._await_azure_copy(src, dst)

    def _await_azure_copy(self, src: str, dst: str) -> None:
        """Azure may finish a server copy after the call that starts it returns, and adlfs
        does not wait: until it has, ``dst`` is not whole, and deleting ``src`` (a move)
        would fail it. Waits for the copy's status on ``dst`` to say success."""
        from fsspec.asyn import sync

        container, blob, _ = self.fs.split_path(self._path(dst), delimiter="/")

        async def status() -> tuple[str | None, str | None]:
            client = self.fs.service_client.get_blob_client(container=container, blob=blob)
            copy = (await client.get_blob_properties()).copy
            return (copy.status, copy.status_description) if copy else (None, None)

        deadline = time.monotonic() + AZURE_COPY_WAIT_S
        while True:
            state, why = sync(self.fs.loop, status)
            if state in (None, "success"):
                return
            if state != "pending":
                raise BlobStorageError(
                    f"could not copy {src} to {dst}: Azure's copy {state} ({why})"
                )
            if time.monotonic() > deadline:
                raise BlobStorageError(
                    f"could not copy {src} to {dst}: Azure's copy still pending after "
                    f"{AZURE_COPY_WAIT_S:g}s ({why}); {src} is left where it is"
                )
            time.sleep(0.2)

    def copy(self, src: str, dst: str) -> tuple[str, int]:
        self._server_copy(src, dst, "copy")
        return self.sha256(dst)

    def sha256(self, uri: str) -> tuple[str, int]:
        # no read-ahead cache: one ranged GET per chunk, each chunk held once
        with (
            self._reading("read", uri),
            self.fs.open(self._path(uri), "rb", block_size=CHUNK, cache_type="none") as f,
        ):
            return digest_of(chunks_of(f))

    def move(self, src: str, dst: str) -> None:
        self._server_copy(src, dst, "move")
        self.delete(src)

    def create_exclusive(self, uri: str, data: bytes) -> bool:
        path = self._path(uri)
        try:
            # The conditional put is the guarantee; the check spares a request (and
            # keeps the answer right on emulators that ignore preconditions).
            if self._isfile(path):
                return False
            self._pipe(path, data, mode="create")
            return True
        except Exception as exc:
            # A conditional put whose answer was lost: the SDK's retry finds the object
            # there (412), or the error is the lost answer itself; ours if it holds data.
            if self._holds(uri, data):
                return True
            if isinstance(exc, FileExistsError) or _precondition_failed(exc):
                return False
            raise self._err("create", uri, exc) from exc


def _precondition_failed(exc: BaseException) -> bool:
    code = str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))
    return code in {"PreconditionFailed", "412", "ConditionalRequestConflict", "409"} or (
        getattr(exc, "code", None) in (409, 412)
    )
