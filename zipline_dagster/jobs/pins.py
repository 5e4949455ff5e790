"""Pinned trainer versions that cannot drift from their source.

A project records each model's trainer version in ``trainers.lock`` at its root (JSON:
model name -> version, the archive's sha256 and the source folder), written by
``zipline-dagster build-trainer``; a declaration reads its version from there
(``pinned_version``), so the content address stays visible in review (the lock's diff)
without being copied by hand.

A model whose trainer source is in the project (``trainers/{model_name}/`` beside the
lock, by convention) and builds to another version than the one it pins has *drifted*:
it would keep training the old archive. ``find_drift`` names each such model, with the
pinned version, the one the source builds to and the command that fixes it; the code
location warns at load, ``zipline-dagster check`` exits non-zero, ``zipline-dagster
backfill`` launches nothing that would train it, and a partition refuses to train.

The lock also pins the project's runtime (``"runtime"``: the build of ``zipline-runtime``
its jobs run with, by content address, and the protocol it speaks); a model declares it
with ``runtime_version=pinned_runtime(near=__file__)``. It moves only when the project
adopts another build (``adopt_runtime``, ``zipline-dagster adopt-runtime``): upgrading the
platform alone re-versions no model.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zipline_dagster.declarations.errors import ModelSpecError
from zipline_dagster.declarations.model import Model
from zipline_dagster.jobs.archive import TrainerArchive, build_trainer_archive
from zipline_dagster.packaging import RuntimeArchive, installed_runtime

LOCK_NAME = "trainers.lock"
#: Where a project keeps its trainers, beside the lock: ``trainers/{model_name}/``.
TRAINERS_DIR = "trainers"


def find_lock(near: str | Path) -> Path:
    """The ``trainers.lock`` of the project holding ``near`` (a declaring module's file,
    or a trainer's folder): the first one found walking up from ``near``'s parent; where
    it would be when there is none yet (the folder holding ``pyproject.toml``, else
    ``near``'s parent). Never inside a trainer's own folder: it would change the archive."""
    base = Path(near).resolve().parent
    folders = [base, *base.parents]
    for folder in folders:
        if (folder / LOCK_NAME).is_file():
            return folder / LOCK_NAME
    for folder in folders:
        if (folder / "pyproject.toml").is_file():
            return folder / LOCK_NAME
    return base / LOCK_NAME


def _read(lock: Path) -> dict[str, Any]:
    if not lock.is_file():
        return {}
    data = json.loads(lock.read_text())
    return data if isinstance(data, dict) else {}


def read_lock(lock: Path) -> dict[str, dict[str, str]]:
    """Model name -> its pin (``version``, ``sha256``, ``source``); {} without a lock."""
    return dict(_read(lock).get("models", {}))


@dataclass(frozen=True)
class RuntimePin:
    """The runtime build a project's jobs run with, as its lock records it."""

    version: str
    sha256: str
    package_version: str
    protocol: int

    @classmethod
    def of(cls, archive: RuntimeArchive) -> RuntimePin:
        return cls(archive.version, archive.sha256, archive.package_version, archive.protocol)


def read_runtime_pin(lock: Path) -> RuntimePin | None:
    """The runtime ``lock`` pins; None when it pins none."""
    pin = _read(lock).get("runtime")
    if not isinstance(pin, dict) or not pin.get("version"):
        return None
    return RuntimePin(
        str(pin["version"]),
        str(pin.get("sha256", "")),
        str(pin.get("package_version", "")),
        int(pin.get("protocol", 0)),
    )


def _write(lock: Path, models: dict[str, Any], runtime: RuntimePin | None) -> None:
    """The whole lock, sorted, so its diff shows exactly the pins that moved."""
    body: dict[str, Any] = {"models": dict(sorted(models.items()))}
    if runtime is not None:
        body["runtime"] = {
            "version": runtime.version,
            "sha256": runtime.sha256,
            "package_version": runtime.package_version,
            "protocol": runtime.protocol,
        }
    write_lock(lock, json.dumps(body, indent=2, sort_keys=True) + "\n")


def record_pin(lock: Path, model_name: str, archive: TrainerArchive, source: Path) -> None:
    """Pin ``model_name`` to ``archive`` in ``lock`` (created if absent; written whole,
    sorted, so its diff shows exactly the pins that moved). A lock that pins no runtime
    yet pins the installed one too (a new project's first trainer)."""
    pins = read_lock(lock)
    try:
        where = source.resolve().relative_to(lock.parent.resolve()).as_posix()
    except ValueError:  # a source outside the project: recorded as given
        where = str(source)
    pins[model_name] = {"version": archive.version, "sha256": archive.sha256, "source": where}
    _write(lock, pins, read_runtime_pin(lock) or RuntimePin.of(installed_runtime()))


def record_runtime_pin(lock: Path, archive: RuntimeArchive) -> RuntimePin | None:
    """Pin the project's runtime to ``archive``; the pin it replaces (None: none)."""
    before = read_runtime_pin(lock)
    _write(lock, read_lock(lock), RuntimePin.of(archive))
    return before


def pinned_runtime(*, near: str | Path) -> str:
    """The runtime build ``trainers.lock`` pins (the lock of the project holding
    ``near``, usually the declaring module's ``__file__``): a model's ``runtime_version``.

    Raises:
        ModelSpecError: no lock, or it pins no runtime (names the command that pins one).
    """
    lock = find_lock(near)
    pin = read_runtime_pin(lock)
    if pin is None:
        raise ModelSpecError(
            f"{lock} pins no runtime; pin the one installed here with "
            "`zipline-dagster adopt-runtime`"
        )
    return pin.version


def write_lock(lock: Path, text: str) -> None:
    """Replace ``lock`` by ``text`` at once: a reader sees the old lock or the new one."""
    tmp = lock.with_name(lock.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(lock)


def pinned_version(model_name: str, *, near: str | Path) -> str:
    """The trainer version ``trainers.lock`` pins for ``model_name`` (the lock of the
    project holding ``near``, usually the declaring module's ``__file__``).

    Raises:
        ModelSpecError: no lock, or no pin for the model (names the command that
            records one).
    """
    lock = find_lock(near)
    pin = read_lock(lock).get(model_name)
    if pin is None or not pin.get("version"):
        raise ModelSpecError(
            f"Model {model_name!r}: {lock} pins no trainer version for it; build its trainer "
            f"with `zipline-dagster build-trainer {TRAINERS_DIR}/{model_name} --model-name "
            f"{model_name} --base URI`, which records the pin"
        )
    return str(pin["version"])


@dataclass(frozen=True)
class Drift:
    """A model whose trainer source builds to another version than the one it pins."""

    model: str
    pinned: str
    built: str
    source: Path
    base: str

    def describe(self) -> str:
        return (
            f"model {self.model!r} pins trainer version {self.pinned}, but its source "
            f"{self.source} builds to {self.built}: it would train the old archive. Run "
            f"`zipline-dagster build-trainer {self.source} --model-name {self.model} --base "
            f"{self.base}` (it uploads the archive and records the new pin in {LOCK_NAME})"
        )


def trainer_source(model: Model, trainers: Path | None) -> Path | None:
    """The model's trainer source in the project (``{trainers}/{model_name}``), if any."""
    source = trainers / model.name if trainers is not None else None
    return source if source is not None and (source / "setup.py").is_file() else None


def drift_of(model: Model, trainers: Path | None) -> Drift | None:
    """The model's drift, or None (its source builds to its pin, or is not in the project)."""
    source = trainer_source(model, trainers)
    if source is None:
        return None
    built = build_trainer_archive(source).version
    if built == model.version:
        return None
    return Drift(model.name, model.version, built, source, model.model_artifact_base_uri)


def find_drift(models: Iterable[Model], trainers: Path | None) -> list[Drift]:
    """Every model of ``models`` whose trainer source in ``trainers`` has drifted."""
    return [d for m in models if (d := drift_of(m, trainers)) is not None]
