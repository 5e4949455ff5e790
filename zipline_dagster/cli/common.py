"""What the CLI's commands share: the code location they act on (``--module`` or the
project's), its declared models and their trainers' drift, the Dagster instance at
``DAGSTER_HOME``, and ``CliError`` for bad input."""

from __future__ import annotations

from pathlib import Path


def project_drift(module: str, models: object) -> list[object]:
    """The drifts (``jobs.pins``) of ``models`` against the trainer sources of the
    project holding the code location ``module`` (``trainers/{model_name}``)."""
    import importlib

    from zipline_dagster.jobs.pins import TRAINERS_DIR, find_drift, find_lock

    project = find_lock(str(importlib.import_module(module).__file__)).parent
    return list(find_drift(models, project / TRAINERS_DIR))  # type: ignore[arg-type]


class CliError(RuntimeError):
    """Bad command-line input; the message says what was given and what is accepted."""


def load_definitions(module: str) -> object:
    """The ``defs`` of a code location module, with clear errors for a bad ``--module``."""
    import importlib
    import logging

    import dagster as dg

    # the drift the code location warns of at load: each command says what it means for it
    drift_warning = logging.getLogger("zipline_dagster.definitions")
    drift_warning.disabled = True
    try:
        loaded = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and module.startswith(exc.name):
            raise CliError(
                f"--module={module!r}: no such module ({exc}); pass the code location's "
                "importable module, e.g. --module zipline_dagster.defs"
            ) from exc
        raise
    finally:
        drift_warning.disabled = False
    defs = getattr(loaded, "defs", None)
    if not isinstance(defs, dg.Definitions):
        found = type(defs).__name__ if defs is not None else "nothing"
        raise CliError(
            f"--module={module!r} defines no `defs` Definitions object (found {found}); "
            "a code location module sets `defs = dg.Definitions(...)` or build_definitions(...)"
        )
    return defs


def declared_models(module: str) -> dict[str, object]:
    """The ``Model``s declared in the code location ``module`` (at module level, in it
    or, for a package such as ``defs/``, in any of its modules), by name."""
    import importlib
    import pkgutil

    from zipline_dagster.declarations.model import Model

    load_definitions(module)
    root = importlib.import_module(module)
    modules = [root]
    if hasattr(root, "__path__"):
        modules += [
            importlib.import_module(f"{module}.{info.name}")
            for info in sorted(pkgutil.iter_modules(root.__path__), key=lambda m: m.name)
        ]
    return {v.name: v for m in modules for v in vars(m).values() if isinstance(v, Model)}


def find_model(module: str, name: str) -> object:
    """The ``Model`` named ``name`` declared in the code location ``module``."""
    models = declared_models(module)
    if name not in models:
        raise CliError(
            f"model {name!r} is not declared in --module={module!r}; declared: "
            + (", ".join(sorted(models)) or "none")
        )
    return models[name]


def project_code_location(start: Path | None = None) -> str:
    """The code location module of the project around ``start`` (the working folder):
    ``[tool.dg.project] code_location_target_module`` (or ``root_module.definitions``)
    of the nearest ``pyproject.toml``."""
    import tomllib

    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        pyproject = folder / "pyproject.toml"
        if not pyproject.is_file():
            continue
        project = tomllib.loads(pyproject.read_text()).get("tool", {}).get("dg", {})
        project = project.get("project", {})
        if project.get("code_location_target_module"):
            return str(project["code_location_target_module"])
        if project.get("root_module"):
            return f"{project['root_module']}.definitions"
        break
    raise CliError(
        f"no Dagster project around {here} (a pyproject.toml with [tool.dg.project]); "
        "pass --module with the code location's module, e.g. --module my_project.defs"
    )


def instance_at_dagster_home() -> object | None:
    """The Dagster instance at ``DAGSTER_HOME``; None when it is not set."""
    import dagster as dg

    from zipline_dagster.settings import settings

    home = settings().dagster_home
    if not home:
        return None
    if not Path(home).is_dir():
        raise CliError(
            f"DAGSTER_HOME={home!r} is not a directory; create it (Dagster keeps its "
            "instance there) or unset DAGSTER_HOME"
        )
    return dg.DagsterInstance.get()


def dagster_instance() -> object:
    instance = instance_at_dagster_home()
    if instance is None:
        raise CliError(
            "DAGSTER_HOME is not set: backfills are recorded in a Dagster instance; "
            "export DAGSTER_HOME=/path/to/dagster_home (the make targets use ./.dagster_home)"
        )
    return instance
