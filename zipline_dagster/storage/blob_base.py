"""What every blob store shares: the ``BlobStore`` protocol, its errors, and streaming
in chunks with a digest. ``storage.blobs`` (the local store, ``blob_store``) and
``storage.object_store`` build on it."""

from __future__ import annotations

import hashlib
from typing import Any, Protocol
from urllib.parse import urlparse

from zipline_dagster.settings import SCHEMES


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


#: Bytes per read when an object is streamed (digests, local copies).
CHUNK = 8 << 20


def digest_of(chunks: Any) -> tuple[str, int]:
    h, size = hashlib.sha256(), 0
    for chunk in chunks:
        h.update(chunk)
        size += len(chunk)
    return h.hexdigest(), size


def chunks_of(f: Any) -> Any:
    return iter(lambda: f.read(CHUNK), b"")


def unsupported_of(uri: str) -> BlobStorageError:
    scheme = urlparse(uri).scheme
    return BlobStorageError(
        f"cannot use {uri!r}: unknown scheme {scheme!r}; accepted: "
        + ", ".join(f"{s}://" for s in SCHEMES)
    )
