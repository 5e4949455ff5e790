"""The code location: every declaration in this package, wired into one ``Definitions``.

Dagster's ``dg`` tooling (``dg check defs``, ``dg list defs``, ``dg dev``, ``dg launch``)
and ``dagster dev -w workspace.yaml`` both load ``defs`` from here. Each module of the
package declares a model and its inputs (``SourceTable``, ``GroupBy``, ``Join``,
``StagingQuery``, ``ExternalTable``, ``Model`` objects at module level); adding a model is
adding one file. ``build_definitions`` then checks every table name across all of them.

This package is the project's code location, not the library: the wheel leaves it out
and nothing in ``zipline_dagster`` imports it.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from zipline_dagster.declarations.features import GroupBy, Join, StagingQuery
from zipline_dagster.declarations.model import Model
from zipline_dagster.declarations.transforms import ModelTransforms
from zipline_dagster.definitions import ExternalTable, SourceTable, build_definitions
from zipline_dagster.defs.resources import resources
from zipline_dagster.jobs.pins import TRAINERS_DIR, find_lock


def collect(package: str = __name__) -> dict[str, list[Any]]:
    """Every declaration at module level in ``package``'s modules, each once, in order."""
    found: dict[str, list[Any]] = {
        "sources": [],
        "external": [],
        "producers": [],
        "models": [],
        "transforms": [],
    }
    seen: set[int] = set()
    kinds = (
        ("sources", SourceTable),
        ("external", ExternalTable),
        ("producers", (GroupBy, Join, StagingQuery)),
        ("models", Model),
        ("transforms", ModelTransforms),
    )
    pkg = importlib.import_module(package)
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{package}.{info.name}")
        for value in vars(module).values():
            for kind, types in kinds:
                if isinstance(value, types) and id(value) not in seen:  # type: ignore[arg-type]
                    seen.add(id(value))
                    found[kind].append(value)
    return found


_declared = collect()
defs = build_definitions(
    sources=_declared["sources"],
    external_tables=_declared["external"],
    producers=_declared["producers"],
    models=_declared["models"],
    transforms=_declared["transforms"],
    resources=resources(),
    # a model whose trainers/{name} source builds to another version than it pins is
    # named at load and refuses to train
    trainers=find_lock(__file__).parent / TRAINERS_DIR,
)
