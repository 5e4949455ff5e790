"""Deterministic zips, and the job-side runtime's build.

The same files give the same bytes on any machine: entries sorted, timestamps and
permissions fixed, stored (not deflated: deflate output depends on the zlib build), and
every entry under exactly one top-level folder (Ray strips a single top-level folder when
it unpacks a remote ``working_dir`` or ``py_modules`` zip). A zip's content address is the
first 12 hex characters of its SHA-256.

The runtime (the ``zipline-runtime`` distribution: what trainers import and the driver
every job runs under) is built the same way from its package folder, so a project can pin
it by content address (``trainers.lock``) and the platform ships that build beside each
trainer archive as Ray ``py_modules``.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import io
import os
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path

#: 1980-01-01 00:00:00, the earliest timestamp a zip entry can hold.
FIXED_DATE_TIME = (1980, 1, 1, 0, 0, 0)
VERSION_LENGTH = 12
#: The runtime's import package, and the single top-level folder of its zip.
RUNTIME_PACKAGE = "zipline_runtime"
RUNTIME_TOP = "zipline-runtime"


class RuntimeBuildError(ValueError):
    """A runtime package or zip is not one (no package folder, no protocol it declares)."""


def content_version(data: bytes) -> str:
    """The content address of ``data``: the first 12 hex characters of its SHA-256."""
    return hashlib.sha256(data).hexdigest()[:VERSION_LENGTH]


def deterministic_zip(top: str, files: list[tuple[str, Path]]) -> bytes:
    """A zip of ``files`` (``(path inside top, real file)``) under the folder ``top``, in
    sorted order, with fixed timestamps and permissions (0755 for executables, else 0644)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        for rel, path in sorted(files):
            info = zipfile.ZipInfo(f"{top}/{rel}", date_time=FIXED_DATE_TIME)
            info.compress_type = zipfile.ZIP_STORED
            info.create_system = 3  # unix, so external_attr means the same everywhere
            mode = 0o755 if os.stat(path).st_mode & stat.S_IXUSR else 0o644
            info.external_attr = (stat.S_IFREG | mode) << 16
            zf.writestr(info, path.read_bytes())
    return buf.getvalue()


@dataclass(frozen=True)
class RuntimeArchive:
    """One build of the runtime: its zip, and what its ``__init__`` declares."""

    data: bytes
    #: the distribution's version (``zipline_runtime.__version__``)
    package_version: str
    #: the job-to-platform protocol it speaks (``zipline_runtime.PROTOCOL_VERSION``)
    protocol: int

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def version(self) -> str:
        """The content address: what a project pins and a model's code version holds."""
        return content_version(self.data)


def _declared(source: bytes, where: str) -> tuple[str, int]:
    """``__version__`` and ``PROTOCOL_VERSION`` of a runtime's ``__init__.py``, read
    without executing it (both must be literals)."""
    found: dict[str, object] = {}
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise RuntimeBuildError(
            f"{where} is not valid Python ({exc.msg}, line {exc.lineno})"
        ) from None
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id in ("__version__", "PROTOCOL_VERSION"):
                with contextlib.suppress(ValueError):
                    found[target.id] = ast.literal_eval(node.value)
    version, protocol = found.get("__version__"), found.get("PROTOCOL_VERSION")
    if not isinstance(protocol, int) or isinstance(protocol, bool) or not isinstance(version, str):
        raise RuntimeBuildError(
            f"{where} declares no __version__ = '...' and PROTOCOL_VERSION = <whole number> "
            f"as literals (found __version__={version!r}, PROTOCOL_VERSION={protocol!r}); "
            "a runtime names the protocol it speaks"
        )
    return version, protocol


def build_runtime_archive(source: str | os.PathLike[str] | None = None) -> RuntimeArchive:
    """Zip a runtime package folder (default: the installed ``zipline_runtime``)
    deterministically: its ``.py`` files under ``zipline-runtime/zipline_runtime/``.

    Raises:
        RuntimeBuildError: the folder holds no ``__init__.py`` declaring its version and
            protocol.
    """
    if source is None:
        import zipline_runtime

        source = Path(zipline_runtime.__file__).parent
    root = Path(source)
    init = root / "__init__.py"
    if not init.is_file():
        raise RuntimeBuildError(f"runtime folder {root} has no __init__.py")
    package_version, protocol = _declared(init.read_bytes(), str(init))
    files = [
        (f"{RUNTIME_PACKAGE}/{path.relative_to(root).as_posix()}", path)
        for path in root.rglob("*.py")
        if "__pycache__" not in path.relative_to(root).parts
    ]
    return RuntimeArchive(deterministic_zip(RUNTIME_TOP, files), package_version, protocol)


@functools.cache
def installed_runtime() -> RuntimeArchive:
    """The build of the runtime installed beside the platform (built once a process)."""
    return build_runtime_archive()


def read_runtime_archive(data: bytes, *, where: str) -> RuntimeArchive:
    """A stored runtime zip, with the version and protocol its ``__init__`` declares.

    Raises:
        RuntimeBuildError: it is not a runtime's zip (names ``where``).
    """
    name = f"{RUNTIME_TOP}/{RUNTIME_PACKAGE}/__init__.py"
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            init = zf.read(name)
    except (zipfile.BadZipFile, KeyError):
        raise RuntimeBuildError(f"{where} is not a runtime's zip: it holds no {name}") from None
    return RuntimeArchive(data, *_declared(init, f"{where}: {name}"))
