"""The champion pointer on storage: which trained partition of a model is the one in use.

``{base}/models/{model_name}/CHAMPION.json`` holds the version, ds, artifact URI, metrics,
the gates that passed, and when, by whom and why it moved. It is written whole (one
object write) under a storage lock (``LOCK_NAME``, taken by ``rollout``); before it
changes, the pointer it replaces is kept under ``{base}/models/{model_name}/_champions/``,
and the new pointer names it (``replaced``), so a rollback walks back one step at a time.
The one reader and writer of those files; ``rollout.champion`` decides what they hold.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from zipline_dagster.declarations.model import VERSION_RE, Model, is_day
from zipline_dagster.storage.blobs import BlobNotFoundError, BlobStore
from zipline_dagster.storage.paths import MANIFEST_NAME, join_uri, model_root_uri

CHAMPION_NAME = "CHAMPION.json"
HISTORY_DIR = "_champions"
LOCK_NAME = "_CHAMPION.lock"


def model_root(model: Model) -> str:
    """``{base}/models/{model_name}``: its partitions, pointer, history and lock."""
    return model_root_uri(model.model_artifact_base_uri, model.name)


def champion_uri(model: Model) -> str:
    return join_uri(model_root(model), CHAMPION_NAME)


def history_uri(model: Model) -> str:
    return join_uri(model_root(model), HISTORY_DIR)


def read_champion(store: BlobStore, model: Model) -> dict[str, Any] | None:
    """The model's champion pointer; None when it has none."""
    try:
        pointer = json.loads(store.read_bytes(champion_uri(model)))
    except BlobNotFoundError:
        return None
    return pointer if isinstance(pointer, dict) else None


def history(store: BlobStore, model: Model) -> list[dict[str, Any]]:
    """Every earlier pointer, oldest first."""
    out = []
    for uri in store.list(history_uri(model)):
        if uri.endswith(".json"):
            out.append(json.loads(store.read_bytes(uri)))
    return sorted(out, key=lambda p: (str(p.get("moved_at")), str(p.get("history_name"))))


def earlier_champions(store: BlobStore, model: Model) -> dict[str, tuple[str, str]]:
    """Every earlier pointer's location and the (version, ds) it pointed at, by the name
    ``write_pointer`` gave it (``{moved at}-{version}-{ds}.json``): what they were, without
    reading each (``read_json_object`` reads one)."""
    out = {}
    for uri in store.list(history_uri(model)):
        stem = uri.rpartition("/")[2].removesuffix(".json")
        rest = stem.partition("-")[2]
        version, ds = rest[:-11], rest[-10:]
        if uri.endswith(".json") and VERSION_RE.match(version) and is_day(ds):
            out[uri] = (version, ds)
    return out


def earlier_pointer(store: BlobStore, model: Model, name: str) -> dict[str, Any]:
    """The earlier pointer kept as ``name`` in the model's history."""
    return dict(json.loads(store.read_bytes(join_uri(history_uri(model), name))))


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
    store: BlobStore, model: Model, pointer: dict[str, Any], current: dict[str, Any] | None
) -> dict[str, Any]:
    """Keep ``current`` in the history, then write ``pointer`` (naming it) in one put."""
    now = _now()
    pointer = {**pointer, "moved_at": now.isoformat(timespec="milliseconds")}
    if current is not None:
        name = (
            f"{now.strftime('%Y%m%dT%H%M%S.%fZ')}-{current.get('version')}-{current.get('ds')}.json"
        )
        kept = {**current, "history_name": name}
        store.write_bytes(join_uri(history_uri(model), name), json.dumps(kept, indent=2).encode())
        pointer.setdefault("replaced", name)
    else:
        pointer.setdefault("replaced", None)
    store.write_bytes(champion_uri(model), json.dumps(pointer, indent=2, sort_keys=True).encode())
    return pointer
