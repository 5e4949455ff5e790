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
import errno
import hashlib
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote, urlparse

from zipline_dagster.settings import SCHEMES, StorageOptions, settings


class BlobStorageError(RuntimeError):
    """A blob storage operation failed; the message names the URI."""


class BlobNotFoundError(BlobStorageError, FileNotFoundError):
    """No object at the URI."""


class BlobStore(Protocol):
    def write_bytes(self, uri: str, data: bytes) -> None:
        """Make the object at ``uri`` hold ``data``. Raises only when it does not: a write
        whose answer was lost (the network failed after the store had it) but which
        landed is read back and succeeds."""
        ...

    def read_bytes(self, uri: str) -> bytes: ...
    def exists(self, uri: str) -> bool: ...
    def list(self, prefix_uri: str) -> list[str]:
        """Full URIs of every object below ``prefix_uri`` (recursive), sorted."""
        ...

    def stamps(self, prefix_uri: str) -> dict[str, str]:
        """{URI: stamp} of every object below ``prefix_uri`` (recursive), from the
        listing alone (no object read): its size and what the store changes whenever
        the object is written (S3's and Azure's ETag, GCS's generation, a local file's
        inode and modification time)."""
        ...

    def delete(self, uri: str) -> None: ...
    def move(self, src: str, dst: str) -> None:
        """Move one object (a rename locally, copy + delete on object stores)."""
        ...

    def copy(self, src: str, dst: str) -> tuple[str, int]:
        """Copy one object and return the SHA-256 (hex) and size of what landed at ``dst``,
        never holding it whole in memory: streamed into a temp file renamed into place
        locally, copied by the server on object stores (once finished, then streamed back
        for the digest)."""
        ...

    def sha256(self, uri: str) -> tuple[str, int]:
        """The SHA-256 (hex) and size of one object, streamed in chunks."""
        ...

    def create_exclusive(self, uri: str, data: bytes) -> bool:
        """Write ``data`` only if nothing is at ``uri``; False when something already is.

        The one atomic primitive locks are built on (``O_EXCL`` locally, a conditional
        put on object stores). ``data`` must be unique to the caller (an owner and a
        time, say): a conditional put whose answer was lost and whose retry found the
        object there is this caller's when the object holds ``data``, and is True.
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


def _is_temp(name: str) -> bool:
    return name.startswith(".") and name.endswith(".tmp")


#: Bytes per read when an object is streamed (digests, local copies).
CHUNK = 8 << 20


def _digest(chunks: Any) -> tuple[str, int]:
    h, size = hashlib.sha256(), 0
    for chunk in chunks:
        h.update(chunk)
        size += len(chunk)
    return h.hexdigest(), size


def _chunks(f: Any) -> Any:
    return iter(lambda: f.read(CHUNK), b"")


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
                    landed = _digest(_written(_chunks(fin), fout))
                os.replace(tmp, target)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        return landed

    def sha256(self, uri: str) -> tuple[str, int]:
        path = local_path(uri)
        try:
            with open(path, "rb") as f:
                return _digest(_chunks(f))
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
    raise _unsupported(f"{scheme}://")


def _unsupported(uri: str) -> BlobStorageError:
    scheme = urlparse(uri).scheme
    return BlobStorageError(
        f"cannot use {uri!r}: unknown scheme {scheme!r}; accepted: "
        + ", ".join(f"{s}://" for s in SCHEMES)
    )


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
            return _digest(_chunks(f))

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
        return ObjectStore(scheme, object_filesystem(scheme, options))
    raise _unsupported(uri)
