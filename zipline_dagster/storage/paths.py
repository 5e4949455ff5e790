"""The one place where archive, model and table locations are derived.

Anyone holding a model definition can compute every path here; nothing has to be told.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from zipline_dagster.declarations.model import Model

from zipline_runtime.contract import MANIFEST_NAME, PartitionRef

__all__ = ["MANIFEST_NAME"]
#: A model partition's card beside its artifacts (a view: not in its manifest).
CARD_NAME = "card.md"


def join_uri(base: str, *parts: str) -> str:
    """Join URI segments with single slashes (``file:///a/`` + ``b`` -> ``file:///a/b``)."""
    out = base.rstrip("/")
    for p in parts:
        p = p.strip("/")
        if p:
            out = f"{out}/{p}"
    return out


def archive_uri(base: str, model_name: str, version: str) -> str:
    """``{base}/builds/{model_name}-{version}.zip``: the code going in."""
    return join_uri(base, "builds", f"{model_name}-{version}.zip")


def model_archive_uri(model: Model) -> str:
    return archive_uri(model.model_artifact_base_uri, model.name, model.version)


def runtime_uri(base: str, version: str) -> str:
    """``{base}/runtimes/zipline-runtime-{version}.zip``: the job-side runtime a project pins,
    shipped beside each trainer archive."""
    return join_uri(base, "runtimes", f"zipline-runtime-{version}.zip")


def model_runtime_uri(model: Model) -> str:
    """The runtime build ``model``'s jobs run with, at its base."""
    return runtime_uri(model.model_artifact_base_uri, model.runtime)


def model_root_uri(base: str, model_name: str) -> str:
    """``{base}/models/{model_name}``: a model's versions, champion pointer and history."""
    return join_uri(base, "models", model_name)


def model_dir_uri(base: str, model_name: str, version: str, ds: str) -> str:
    """``{base}/models/{model_name}/{version}/{ds}``: artifacts coming out, per partition
    (``PartitionRef.uri``)."""
    return PartitionRef.of(model_name, version, ds).uri(base)


def model_partition_uri(model: Model, ds: str) -> str:
    return model_dir_uri(model.model_artifact_base_uri, model.name, model.version, ds)


def table_uri(warehouse: str, table: str) -> str:
    """A table ``ns.name`` lives at ``{warehouse}/ns/name`` (its Iceberg location: the
    platform creates its tables there)."""
    ns, name = table.split(".", 1)
    return join_uri(warehouse, ns, name)
