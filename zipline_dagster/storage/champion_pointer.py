"""The champion pointer on storage: which trained partition of a model is the one in use.

``{base}/models/{model_name}/CHAMPION.json`` holds the version, ds, artifact URI, metrics,
the gates that passed, and when, by whom and why it moved. It is written whole (one
object write) under a storage lock (``LOCK_NAME``, taken by ``rollout``); before it
changes, the pointer it replaces is kept under ``{base}/models/{model_name}/_champions/``,
and the new pointer names it (``replaced``), so a rollback walks back one step at a time.
The one reader and writer of those files; ``rollout.champion`` decides what they hold.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from zipline_runtime import contract
from zipline_runtime.contract import PartitionRef

from zipline_dagster.declarations.model import Model
from zipline_dagster.storage.blobs import BlobNotFoundError, BlobStore
from zipline_dagster.storage.paths import MANIFEST_NAME, join_uri, model_root_uri

CHAMPION_NAME = "CHAMPION.json"
HISTORY_DIR = "_champions"
LOCK_NAME = "_CHAMPION.lock"


#: ``Challenger.status``: scored beside the champion, not judged yet
SHADOWING = "shadowing"
#: ``Challenger.status``: worse than the champion on live days; never advanced to
RETIRED = "retired"


@dataclass(frozen=True)
class Challenger:
    """A passing partition of a new trainer version scored beside the champion before it
    may serve (``RolloutStrategy(kind="shadow")``), as the champion pointer holds it."""

    version: str
    ds: str
    artifact_uri: str
    attempt: str | None = None
    #: its metrics when it was judged (``{split}_{metric}``)
    metrics: Mapping[str, float] = field(default_factory=dict)
    status: str = SHADOWING
    #: when it became the challenger, and the verdict on it (the days and their numbers)
    since: str = ""
    verdict: str = ""

    @property
    def where(self) -> str:
        return contract.where(self.version, self.ds)

    def ref(self, model: str) -> PartitionRef:
        """The partition it names, of ``model``."""
        return PartitionRef.of(model, self.version, self.ds)

    @classmethod
    def parse(cls, raw: Any) -> Challenger | None:
        if not isinstance(raw, Mapping) or not raw.get("version") or not raw.get("ds"):
            return None
        return cls(
            version=str(raw["version"]),
            ds=str(raw["ds"]),
            artifact_uri=str(raw.get("artifact_uri") or ""),
            attempt=str(raw["attempt"]) if raw.get("attempt") else None,
            metrics=_floats(raw, "metrics"),
            status=str(raw.get("status") or SHADOWING),
            since=str(raw.get("since") or ""),
            verdict=str(raw.get("verdict") or ""),
        )

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["metrics"] = dict(self.metrics)
        return out


@dataclass(frozen=True)
class ChampionPointer:
    """What ``CHAMPION.json`` (and each pointer in the history) holds: the partition in
    use and why it is there."""

    model: str
    version: str
    ds: str
    #: the partition's folder
    artifact_uri: str
    #: the attempt judged: the partition trained again holds another, never judged
    attempt: str | None = None
    #: the partition's metrics when it was judged (``{split}_{metric}``)
    metrics: Mapping[str, float] = field(default_factory=dict)
    checks_passed: tuple[str, ...] = ()
    #: the gates that failed (a champion forced by hand), with their numbers
    checks_failed: Mapping[str, str] = field(default_factory=dict)
    forced: bool = False
    #: the gates it was judged under: a champion forced by hand is judged again only
    #: once they change
    gates_version: str | None = None
    moved_by: str = ""
    why: str = ""
    moved_at: str | None = None
    #: the history name of the pointer this one replaced (None: the first champion)
    replaced: str | None = None
    #: its name in the history, once it was replaced
    history_name: str | None = None
    #: partitions (``{version}/{ds}``) rolled back from by policy: the automatic advance
    #: never moves to them again (a person may promote one by hand); carried from pointer
    #: to pointer
    retired: tuple[str, ...] = ()
    #: the shadow rollout's challenger (or the last one, retired); None when there is none
    challenger: Challenger | None = None

    @property
    def shadowed_by(self) -> Challenger | None:
        """The challenger scored beside this champion now (None: none shadows it)."""
        c = self.challenger
        return c if c is not None and c.status == SHADOWING else None

    @property
    def where(self) -> str:
        """``{version}/{ds}``, as messages name a champion."""
        return self.ref.where

    @property
    def ref(self) -> PartitionRef:
        """The partition it points at."""
        return PartitionRef.of(self.model, self.version, self.ds)

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> ChampionPointer:
        def text(key: str) -> str | None:
            value = raw.get(key)
            return str(value) if value is not None and value != "" else None

        return cls(
            model=str(raw.get("model") or ""),
            version=str(raw.get("version") or ""),
            ds=str(raw.get("ds") or ""),
            artifact_uri=str(raw.get("artifact_uri") or ""),
            attempt=text("attempt"),
            metrics=_floats(raw, "metrics"),
            checks_passed=_strings(raw, "checks_passed"),
            checks_failed={str(k): str(v) for k, v in (raw.get("checks_failed") or {}).items()},
            forced=bool(raw.get("forced")),
            gates_version=text("gates_version"),
            moved_by=str(raw.get("moved_by") or ""),
            why=str(raw.get("why") or ""),
            moved_at=text("moved_at"),
            replaced=text("replaced"),
            history_name=text("history_name"),
            retired=_strings(raw, "retired"),
            challenger=Challenger.parse(raw.get("challenger")),
        )

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["metrics"], out["checks_failed"] = dict(self.metrics), dict(self.checks_failed)
        out["checks_passed"] = list(self.checks_passed)
        out["retired"] = list(self.retired)
        out["challenger"] = self.challenger.to_json() if self.challenger is not None else None
        if self.history_name is None:
            del out["history_name"]  # only a pointer kept in the history has one
        return out


def _floats(raw: Mapping[str, Any], key: str) -> dict[str, float]:
    """The numbers of the mapping ``raw[key]`` (a metrics record), by name."""
    return {
        str(k): float(v)
        for k, v in (raw.get(key) or {}).items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }


def _strings(raw: Mapping[str, Any], key: str) -> tuple[str, ...]:
    return tuple(str(v) for v in raw.get(key) or ())


def model_root(model: Model) -> str:
    """``{base}/models/{model_name}``: its partitions, pointer, history and lock."""
    return model_root_uri(model.model_artifact_base_uri, model.name)


def champion_uri(model: Model) -> str:
    return join_uri(model_root(model), CHAMPION_NAME)


def history_uri(model: Model) -> str:
    return join_uri(model_root(model), HISTORY_DIR)


def read_champion(store: BlobStore, model: Model) -> ChampionPointer | None:
    """The model's champion pointer; None when it has none."""
    try:
        pointer = json.loads(store.read_bytes(champion_uri(model)))
    except BlobNotFoundError:
        return None
    return ChampionPointer.parse(pointer) if isinstance(pointer, dict) else None


def history(store: BlobStore, model: Model) -> list[ChampionPointer]:
    """Every earlier pointer, oldest first."""
    out = []
    for uri in store.list(history_uri(model)):
        if uri.endswith(".json"):
            out.append(ChampionPointer.parse(json.loads(store.read_bytes(uri))))
    return sorted(out, key=lambda p: (str(p.moved_at), str(p.history_name)))


def earlier_pointers(store: BlobStore, model: Model) -> list[ChampionPointer]:
    """Every earlier pointer of the history that can be read (one gone since it was
    listed, or not a pointer, is passed over), in the history's order."""
    out = []
    for uri in store.list(history_uri(model)):
        if not uri.endswith(".json"):
            continue
        try:
            out.append(earlier_pointer(store, model, uri.rpartition("/")[2]))
        except (FileNotFoundError, ValueError):
            continue
    return out


def earlier_pointer(store: BlobStore, model: Model, name: str) -> ChampionPointer:
    """The earlier pointer kept as ``name`` in the model's history."""
    return ChampionPointer.parse(json.loads(store.read_bytes(join_uri(history_uri(model), name))))


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def trained_partitions(store: BlobStore, model: Model, version: str | None = None) -> list[str]:
    """Days of ``version`` (default the model's) that have a manifest, oldest first."""
    root = join_uri(model_root(model), version or model.version)
    days = set()
    for uri in store.list(root):
        rel = uri[len(root) :].lstrip("/")
        ds, _, rest = rel.partition("/")
        if rest == MANIFEST_NAME:
            days.add(ds)
    return sorted(days)


def write_pointer(
    store: BlobStore,
    model: Model,
    pointer: ChampionPointer,
    current: ChampionPointer | None,
    *,
    rollback: bool = False,
    amend: bool = False,
) -> ChampionPointer:
    """Keep ``current`` in the history, then write ``pointer`` in one put, naming the
    one it replaced; a ``rollback``'s pointer keeps the ``replaced`` of the earlier
    pointer it restores (a rollback walks back one step at a time). An ``amend`` (the
    same champion, its challenger changed) keeps the champion's ``replaced`` and
    ``moved_at``: the history holds the pointer as it was, a rollback skips it."""
    now = _now()
    # what was retired stays retired, but for the partition this pointer names (promoted
    # by hand) and its version
    retired = {*(current.retired if current is not None else ()), *pointer.retired}
    pointer = dataclasses.replace(
        pointer,
        moved_at=pointer.moved_at if amend else now.isoformat(timespec="milliseconds"),
        retired=tuple(sorted(retired - {pointer.where, f"{pointer.version}/*"})),
    )
    rollback = rollback or amend
    if current is not None:
        name = f"{now.strftime('%Y%m%dT%H%M%S.%fZ')}-{current.version}-{current.ds}.json"
        kept = dataclasses.replace(current, history_name=name).to_json()
        store.write_bytes(join_uri(history_uri(model), name), json.dumps(kept, indent=2).encode())
        if not rollback:
            pointer = dataclasses.replace(pointer, replaced=name)
    body = json.dumps(pointer.to_json(), indent=2, sort_keys=True).encode()
    store.write_bytes(champion_uri(model), body)
    return pointer
