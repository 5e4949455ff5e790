"""Deterministic, content-addressed trainer archives.

The same source gives the same bytes on any machine: entries are sorted, timestamps and
permissions fixed, caches/VCS/build output left out, and every entry sits under exactly
one top-level folder (Ray strips a single top-level folder when it unpacks a remote
``working_dir``, so a zip holding only ``trainer/`` would lose the package). An archive
holds the trainer's own files only: what jobs import from the platform is the runtime
(``zipline_runtime``), which reaches each job beside it, so a trainer's content address
is its own code.
"""

from __future__ import annotations

import ast
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from zipline_dagster.packaging import (
    FIXED_DATE_TIME,
    RUNTIME_PACKAGE,
    VERSION_LENGTH,
    content_version,
    deterministic_zip,
)

if TYPE_CHECKING:
    from zipline_dagster.settings import StorageOptions

__all__ = ["FIXED_DATE_TIME", "VERSION_LENGTH", "content_version"]


EXCLUDED_DIR_NAMES = frozenset(
    {
        "__pycache__",
        ".git",
        ".hg",
        ".svn",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        ".tox",
        ".nox",
        ".venv",
        "venv",
        "build",
        "dist",
        ".eggs",
        ".ipynb_checkpoints",
        ".idea",
        ".vscode",
    }
)
EXCLUDED_FILE_SUFFIXES = (".pyc", ".pyo", ".so.tmp", ".swp", "~")
EXCLUDED_FILE_NAMES = frozenset({".DS_Store", "Thumbs.db"})


class TrainerArchiveError(ValueError):
    """The trainer folder cannot be archived (missing, escaping symlink, no setup.py...)."""


#: A distribution name usable as the archive's single top-level folder.
_TOP_LEVEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def setup_keywords(source: str | bytes, *, where: str) -> dict[str, object]:
    """``name`` and ``install_requires`` of a ``setup.py``, read without executing it.

    Both must be literals (a string; a list of strings): the archive's top-level folder
    and the job's environment are derived from them, so they cannot depend on what a
    build machine happens to have.

    Raises:
        TrainerArchiveError: the file does not parse, calls no ``setup(...)``, or a
            keyword is not a literal (names the file, the keyword and the expression).
    """
    out: dict[str, object] = {}
    for kw in _setup_call(source, where).keywords:
        if kw.arg in ("name", "install_requires"):
            out[kw.arg] = _literal_keyword(kw, where)
    if "name" not in out:
        raise TrainerArchiveError(
            f"{where} sets no name=...; the package name names the archive's top-level folder"
        )
    return out


def _setup_call(source: str | bytes, where: str) -> ast.Call:
    """The first ``setup(...)`` call of a ``setup.py``."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise TrainerArchiveError(
            f"{where} is not valid Python (SyntaxError: {exc.msg}, line {exc.lineno})"
        ) from exc
    calls = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", getattr(node.func, "attr", None)) == "setup"
    ]
    if not calls:
        raise TrainerArchiveError(f"{where} calls no setup(...); a trainer is a normal package")
    return calls[0]


def _literal_keyword(kw: ast.keyword, where: str) -> object:
    """The value of ``name`` (a package name) or ``install_requires`` (a list of strings),
    which must be written out as a literal."""
    try:
        value = ast.literal_eval(kw.value)
    except ValueError as exc:
        raise TrainerArchiveError(
            f"{where}: {kw.arg}={ast.unparse(kw.value)} is not a literal; write it out "
            + ("as a string" if kw.arg == "name" else "as a list of requirement strings")
            + " (the platform reads it without running setup.py)"
        ) from exc
    if kw.arg == "name":
        if not (isinstance(value, str) and _TOP_LEVEL_RE.match(value)):
            raise TrainerArchiveError(
                f"{where}: name={value!r} is invalid; expected a package name of letters, "
                "digits, '.', '_' and '-' (it names the archive's top-level folder)"
            )
        return value
    if not (isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)):
        raise TrainerArchiveError(
            f"{where}: install_requires={ast.unparse(kw.value)} is invalid; expected a "
            "list of requirement strings such as ['pandas>=2.3,<3']"
        )
    return list(value)


@dataclass(frozen=True)
class TrainerArchive:
    data: bytes
    sha256: str
    #: files in the archive, as stored (``{top}/path``)
    names: tuple[str, ...]

    @property
    def version(self) -> str:
        """The content address: the first 12 hex characters of the zip's SHA-256."""
        return self.sha256[:VERSION_LENGTH]


def _excluded(rel: Path, is_dir: bool) -> bool:
    if is_dir:
        return rel.name in EXCLUDED_DIR_NAMES or rel.name.endswith(".egg-info")
    return rel.name in EXCLUDED_FILE_NAMES or rel.name.endswith(EXCLUDED_FILE_SUFFIXES)


def _collect(root: Path) -> list[tuple[str, Path]]:
    """(archive-relative posix path, real file) for every file, sorted, with checks."""
    files: list[tuple[str, Path]] = []
    real_root = root.resolve()

    def walk(directory: Path) -> None:
        for entry in sorted(os.scandir(directory), key=lambda e: e.name):
            path = Path(entry.path)
            rel = path.relative_to(root)
            if entry.is_symlink():
                target = path.resolve()
                if not target.is_relative_to(real_root):
                    raise TrainerArchiveError(
                        f"trainer folder {root}: symlink {rel.as_posix()} points outside the "
                        f"package (to {os.readlink(path)}); only links inside the package are "
                        "allowed, so the archive holds exactly the code it is named after"
                    )
                if not target.exists():
                    raise TrainerArchiveError(
                        f"trainer folder {root}: symlink {rel.as_posix()} is dangling "
                        f"(to {os.readlink(path)})"
                    )
            is_dir = path.is_dir()
            if _excluded(rel, is_dir):
                continue
            if is_dir:
                if entry.is_symlink():
                    raise TrainerArchiveError(
                        f"trainer folder {root}: {rel.as_posix()} is a symlink to a folder; "
                        "only file symlinks inside the package are allowed"
                    )
                walk(path)
            elif path.is_file():
                files.append((rel.as_posix(), path))

    walk(root)
    return files


def build_trainer_archive(source: str | os.PathLike[str]) -> TrainerArchive:
    """Zip a trainer package folder deterministically.

    The single top-level folder inside the zip (Ray strips it when it unpacks the
    archive) is the package's ``setup.py`` name, never the folder it was built from: the
    same files anywhere give the same bytes and so the same version.

    Args:
        source: the package folder (holding ``setup.py`` and the trainer module).

    Returns:
        The archive bytes, their SHA-256 and the entry names. ``.version`` is the
        content address to declare on the ``Model``.

    Raises:
        TrainerArchiveError: the folder is missing, has no ``setup.py`` (or one whose
            ``name``/``install_requires`` are not literals), or holds a symlink that
            points outside it.
    """
    root = Path(source)
    if not root.is_dir():
        raise TrainerArchiveError(f"trainer folder {root} does not exist or is not a folder")
    if not (root / "setup.py").is_file():
        raise TrainerArchiveError(
            f"trainer folder {root} has no setup.py; a trainer is a normal package with "
            "setup.py (name, install_requires) and a module Ray can run (trainer/train.py)"
        )
    top = str(setup_keywords((root / "setup.py").read_bytes(), where=f"{root}/setup.py")["name"])

    files = _collect(root)
    taken = sorted({rel.split("/")[0] for rel, _ in files} & {RUNTIME_PACKAGE})
    if taken:
        raise TrainerArchiveError(
            f"trainer folder {root} has its own {taken[0]}/; that name is the platform's "
            "runtime, which reaches every job beside the archive (the project pins it)"
        )
    data = deterministic_zip(top, files)
    return TrainerArchive(
        data=data,
        sha256=hashlib.sha256(data).hexdigest(),
        names=tuple(f"{top}/{rel}" for rel, _ in sorted(files)),
    )


class ArchiveVerificationError(RuntimeError):
    """The stored archive is missing or its bytes do not hash to the declared version."""


@dataclass(frozen=True)
class PublishedArchive:
    version: str
    uri: str
    size: int


def check_model_name(model_name: str) -> None:
    """``model_name`` can name an archive (it is part of the archive's path)."""
    from zipline_dagster.declarations.model import MODEL_NAME_ACCEPTED, MODEL_NAME_RE

    if not MODEL_NAME_RE.match(model_name):
        raise TrainerArchiveError(
            f"model name {model_name!r} is invalid; expected {MODEL_NAME_ACCEPTED}"
        )


def publish_trainer_archive(
    source: str | os.PathLike[str],
    *,
    model_name: str,
    base: str,
    options: StorageOptions | None = None,
) -> PublishedArchive:
    """Build the archive and upload it to ``{base}/builds/{model_name}-{version}.zip``,
    and the runtime installed here beside it (``{base}/runtimes/``: the build a project
    that adopted it pins, which every job needs next to its archive).

    Uploading the same bytes twice is a no-op in effect: the name is the content.
    """
    from zipline_dagster.jobs.runtime import store_runtime
    from zipline_dagster.packaging import installed_runtime
    from zipline_dagster.storage.blobs import blob_store
    from zipline_dagster.storage.paths import archive_uri

    check_model_name(model_name)
    archive = build_trainer_archive(source)
    uri = archive_uri(base, model_name, archive.version)
    store = blob_store(uri, options=options)
    if not (store.exists(uri) and content_version(store.read_bytes(uri)) == archive.version):
        store.write_bytes(uri, archive.data)
    store_runtime(base, installed_runtime(), options=options)
    return PublishedArchive(version=archive.version, uri=uri, size=len(archive.data))


def load_verified_archive(
    *, base: str, model_name: str, version: str, options: StorageOptions | None = None
) -> tuple[str, bytes]:
    """Read the archive at its derived path and check it hashes to ``version``.

    Returns:
        The archive URI and its bytes.

    Raises:
        TrainerArchiveError: ``model_name`` or ``version`` cannot name an archive (they
            make its path; nothing is read).
        ArchiveVerificationError: absent, or its bytes hash to another version (both
            messages name the path).
    """
    from zipline_dagster.declarations.model import VERSION_ACCEPTED, VERSION_RE
    from zipline_dagster.storage.blobs import BlobNotFoundError, blob_store
    from zipline_dagster.storage.paths import archive_uri

    check_model_name(model_name)
    if not VERSION_RE.match(version):
        raise TrainerArchiveError(
            f"version {version!r} is not a trainer archive's content address; expected "
            f"{VERSION_ACCEPTED}"
        )
    uri = archive_uri(base, model_name, version)
    try:
        data = blob_store(uri, options=options).read_bytes(uri)
    except BlobNotFoundError as exc:
        raise ArchiveVerificationError(
            f"trainer archive for model {model_name!r} version {version} is missing: no object "
            f"at {uri}. Build and upload it with `zipline-dagster build-trainer trainers/"
            f"{model_name} --model-name {model_name} --base {base}`."
        ) from exc
    actual = hashlib.sha256(data).hexdigest()
    if not actual.startswith(version):
        raise ArchiveVerificationError(
            f"trainer archive at {uri} does not match its version: its bytes hash to "
            f"{actual[: len(version)]}, not {version}. The object was modified after upload; "
            "rebuild and re-upload it, and never overwrite a content-addressed archive."
        )
    return uri, data


def verify_trainer_archive(
    *, base: str, model_name: str, version: str, options: StorageOptions | None = None
) -> str:
    """Check the archive exists at its derived path and hashes to ``version``; its URI."""
    return load_verified_archive(
        base=base, model_name=model_name, version=version, options=options
    )[0]
