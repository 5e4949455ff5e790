"""The runtime a model's jobs run with: its build in blob storage, checked before a job.

A project pins one build of ``zipline-runtime`` (``trainers.lock``; a model declares it
with ``runtime_version=pinned_runtime(near=__file__)``). Every job of the model gets that
build beside its trainer archive, as Ray ``py_modules`` (the local launcher puts it first
on the trainer's ``PYTHONPATH``), from ``{base}/runtimes/zipline-runtime-{version}.zip``.
Before a job is submitted the build is read there, checked against its content address
and refused when it speaks a protocol this platform does not; a build that is not stored
yet is uploaded when it is the one installed with the platform.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import zipline_runtime

from zipline_dagster.packaging import (
    RuntimeArchive,
    RuntimeBuildError,
    content_version,
    installed_runtime,
    read_runtime_archive,
)
from zipline_dagster.storage.blobs import BlobNotFoundError, blob_store
from zipline_dagster.storage.paths import runtime_uri

if TYPE_CHECKING:
    from zipline_dagster.settings import StorageOptions

#: The job-to-platform protocols this platform speaks: its installed runtime's.
SPOKEN_PROTOCOLS = frozenset({zipline_runtime.PROTOCOL_VERSION})


class RuntimeShipError(RuntimeError):
    """The pinned runtime cannot run a job: missing, altered, or of another protocol."""


@dataclass(frozen=True)
class ShippedRuntime:
    """A runtime build stored where jobs fetch it, verified."""

    uri: str
    archive: RuntimeArchive

    @property
    def version(self) -> str:
        return self.archive.version


def check_protocol(archive: RuntimeArchive, where: str) -> None:
    """Refuse a runtime whose protocol this platform does not speak, naming both.

    Raises:
        RuntimeShipError: names the runtime, its protocol and the ones spoken here.
    """
    if archive.protocol in SPOKEN_PROTOCOLS:
        return
    spoken = ", ".join(str(p) for p in sorted(SPOKEN_PROTOCOLS))
    raise RuntimeShipError(
        f"runtime {archive.version} (zipline-runtime {archive.package_version}, at {where}) "
        f"speaks protocol {archive.protocol}; this platform speaks protocol {spoken} "
        f"(zipline-runtime {zipline_runtime.__version__} installed). Adopt a runtime it "
        "speaks with `zipline-dagster adopt-runtime`, which names the models it re-versions"
    )


def store_runtime(
    base: str, archive: RuntimeArchive, *, options: StorageOptions | None = None
) -> str:
    """Store the runtime build ``archive`` at ``base`` (once: its name is its content);
    its URI."""
    uri = runtime_uri(base, archive.version)
    store = blob_store(uri, options=options)
    if not store.exists(uri):
        store.write_bytes(uri, archive.data)
    return uri


def ship_runtime(
    base: str, version: str, *, options: StorageOptions | None = None
) -> ShippedRuntime:
    """The runtime build ``version`` at ``base``, verified; uploaded first when it is
    missing there and is the build installed with the platform.

    Raises:
        RuntimeShipError: missing (and not the installed build), altered, not a runtime,
            or of a protocol this platform does not speak (each names the URI).
    """
    uri = runtime_uri(base, version)
    store = blob_store(uri, options=options)
    try:
        data = store.read_bytes(uri)
    except BlobNotFoundError:
        installed = installed_runtime()
        if installed.version != version:
            raise RuntimeShipError(
                f"runtime {version} is pinned, but no build of it is at {uri}, and the runtime "
                f"installed here builds to {installed.version}. Upload the pinned build, or "
                "adopt the installed one with `zipline-dagster adopt-runtime`"
            ) from None
        store.write_bytes(uri, installed.data)
        data = installed.data
    actual = content_version(data)
    if actual != version:
        raise RuntimeShipError(
            f"runtime at {uri} does not match its version: its bytes hash to {actual}, not "
            f"{version}. It was modified after upload; never overwrite a content-addressed build"
        )
    try:
        archive = read_runtime_archive(data, where=uri)
    except RuntimeBuildError as exc:
        raise RuntimeShipError(str(exc)) from None
    check_protocol(archive, uri)
    return ShippedRuntime(uri, archive)
