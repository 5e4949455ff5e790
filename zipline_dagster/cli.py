"""``zipline-dagster``: build and verify trainer archives, run the embedded Ray head, backfill,
move a model's champion pointer (promote, rollback)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any


def _build_trainer(args: argparse.Namespace) -> int:
    from zipline_dagster.training.archive import build_trainer_archive, publish_trainer_archive
    from zipline_dagster.training.pins import find_lock, read_lock, record_pin

    lock = find_lock(args.path)
    archive = build_trainer_archive(args.path)
    if args.check:  # verify the pin without writing anything
        pinned = read_lock(lock).get(args.model_name, {}).get("version")
        if pinned != archive.version:
            print(
                f"error: {args.path} builds trainer version {archive.version}, but {lock} pins "
                f"{pinned or 'nothing'} for {args.model_name}; run this command without --check "
                "(with --base) to upload it and record the pin",
                file=sys.stderr,
            )
            return 1
        print(f"ok: {args.path} builds {archive.version}, as {lock} pins for {args.model_name}")
        return 0
    if not args.base:
        raise CliError("build-trainer needs --base URI (where builds/ go) unless --check")
    print(f"building trainer archive from {args.path} ...", file=sys.stderr)
    published = publish_trainer_archive(args.path, model_name=args.model_name, base=args.base)
    record_pin(lock, args.model_name, archive, Path(args.path))
    print(f"uploaded {published.size} bytes to {published.uri}", file=sys.stderr)
    print(f"pinned {args.model_name} to {published.version} in {lock}", file=sys.stderr)
    print(f"version={published.version}")
    print(f"uri={published.uri}")
    return 0


def _new_model(args: argparse.Namespace) -> int:
    import importlib.util

    import dagster as dg

    from zipline_dagster.declarations.model import MODEL_NAME_ACCEPTED, MODEL_NAME_RE
    from zipline_dagster.lineage.partitions import model_asset_key
    from zipline_dagster.scaffold import Scaffold, ScaffoldError
    from zipline_dagster.settings import artifact_base_uri
    from zipline_dagster.training.archive import publish_trainer_archive

    name = args.name
    if not MODEL_NAME_RE.match(name) or not name.isidentifier():
        raise CliError(
            f"new-model {name!r}: expected {MODEL_NAME_ACCEPTED}, also a Python name "
            "(it names the defs module and the declaration)"
        )
    scaffold = Scaffold.of(
        name, table=args.table, task=args.task, window=args.window, features=args.features,
        label=args.label, keys=args.keys, threshold=args.threshold,
    )  # fmt: skip
    module = args.module or project_code_location()
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise CliError(f"--module={module!r} is not a package whose modules declare models")
    defs_file = Path(next(iter(spec.submodule_search_locations))) / f"{name}.py"
    try:
        written = scaffold.write(
            defs_file, module, template=args.template, load=lambda: load_definitions(module)
        )
    except ScaffoldError as exc:
        raise CliError(str(exc)) from exc.__cause__
    published = publish_trainer_archive(written.trainer, model_name=name, base=artifact_base_uri())
    print(f"wrote {written.trainer}/ (from {written.template}) and {defs_file}", file=sys.stderr)
    print(
        f"pinned {name} to {published.version} in {written.lock}; uploaded {published.uri}",
        file=sys.stderr,
    )
    defs = written.defs
    assert isinstance(defs, dg.Definitions)
    if model_asset_key(name) not in defs.resolve_asset_graph().get_all_asset_keys():
        print(
            f"note: the defs of {module} do not include {name}: its package does not collect "
            f"its modules; add {name} to the models of its build_definitions(...)",
            file=sys.stderr,
        )
    print(
        f"next: `dg check defs`, then `zipline-dagster backfill {name} --start-ds D1 "
        "--end-ds D2 --wait` trains it and moves its champion",
        file=sys.stderr,
    )
    print(f"version={published.version}")
    return 0


def project_drift(module: str, models: object) -> list[object]:
    """The drifts (``training.pins``) of ``models`` against the trainer sources of the
    project holding the code location ``module`` (``trainers/{model_name}``)."""
    import importlib

    from zipline_dagster.training.pins import TRAINERS_DIR, find_drift, find_lock

    project = find_lock(str(importlib.import_module(module).__file__)).parent
    return list(find_drift(models, project / TRAINERS_DIR))  # type: ignore[arg-type]


def _check(args: argparse.Namespace) -> int:
    module = args.module or project_code_location()
    models = declared_models(module).values()
    drifts: list = project_drift(module, models)
    for drift in drifts:
        print(f"error: {drift.describe()}", file=sys.stderr)
    if drifts:
        return 1
    print(f"ok: {len(models)} model(s) of {module}; every trainer in the project builds to its pin")
    return 0


def _verify_trainer(args: argparse.Namespace) -> int:
    from zipline_dagster.training.archive import verify_trainer_archive

    uri = verify_trainer_archive(base=args.base, model_name=args.model_name, version=args.version)
    print(f"ok: {uri} hashes to {args.version}")
    return 0


def _ray(args: argparse.Namespace) -> int:
    from zipline_dagster.training.launchers.ray_head import LocalRayHead

    head = LocalRayHead(args.state_dir, num_cpus=args.num_cpus)
    if args.action == "up":
        print("starting the embedded Ray head (reused if already running) ...", file=sys.stderr)
        info = head.ensure_running()
        print(
            f"ray head running: pid={info.pid} dashboard={info.dashboard_url} ray={info.ray_version}"
        )
        print(f"export RAY_ADDRESS={info.dashboard_url}  # to point other tools at it")
        return 0
    if args.action == "down":
        stopped = head.stop()
        print("ray head stopped" if stopped else "no embedded ray head was running")
        return 0
    running = head.status()
    if running is None:
        print("no embedded ray head is running (start it with `zipline-dagster ray up`)")
        return 3
    print(
        f"ray head running: pid={running.pid} dashboard={running.dashboard_url} "
        f"ray={running.ray_version} log={running.log_path}"
    )
    return 0


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


def _configured(module: str) -> tuple[object, object]:
    """The code location's warehouse and MLflow resources, as its runs use them (the
    settings' where it has none)."""
    from zipline_dagster.storage.resources import warehouse_of
    from zipline_dagster.tracking import mlflow_of

    defs = load_definitions(module)
    return warehouse_of(defs), mlflow_of(defs)  # type: ignore[arg-type]


def _print_pointer(pointer: dict[str, object]) -> None:
    import json

    print(json.dumps(pointer, indent=2, sort_keys=True))


def _moved(
    args: argparse.Namespace,
    model: object,
    store: object,
    pointer: dict[str, object],
    left: list[str],
    configured: tuple[object, object],
) -> int:
    """Say where the champion moved (and any lock left behind), move MLflow's alias
    after it when the code location has MLflow on, print the pointer."""
    from zipline_dagster.rollout.assets import sync_mlflow
    from zipline_dagster.rollout.champion import lock_left_behind

    print(
        f"{args.model} champion -> {pointer['version']}/{pointer['ds']} ({pointer['why']})",
        file=sys.stderr,
    )
    if left:
        print(f"warning: {lock_left_behind(model, left)}", file=sys.stderr)  # type: ignore[arg-type]
    warehouse, mlflow = configured
    tracker = mlflow.tracker(  # type: ignore[attr-defined]
        lambda text: print(f"warning: {text}", file=sys.stderr),
        warehouse.store,  # type: ignore[attr-defined]
    )
    if tracker is not None:
        synced = sync_mlflow(tracker, model, store, pointer, moved=True)  # type: ignore[arg-type]
        if synced is not None and synced.url:
            print(
                f"MLflow: {args.model}@champion -> version {synced.version} ({synced.url})",
                file=sys.stderr,
            )
    _print_pointer(pointer)
    return 0


def _ledger_check(model: object, warehouse: object) -> object:
    """The ledger's rule for the partition being promoted (``why_in_flight``: recorded
    into Dagster from storage when its run ended without recording it, refused while a
    run is still writing it), on the instance at DAGSTER_HOME; when it is not set, no
    check (said on stderr once a trained partition is found)."""
    from zipline_dagster.lineage.ledger import Ledger
    from zipline_dagster.rollout.assets import gate_judge, why_in_flight

    instance = instance_at_dagster_home()
    if instance is None:
        note = (
            "note: DAGSTER_HOME is not set, so the partition is not checked against what "
            "Dagster recorded for it"
        )
        return lambda ds, manifest: print(note, file=sys.stderr)
    ledger = Ledger(instance, judge=gate_judge(model, store=warehouse.store))  # type: ignore[arg-type, attr-defined]
    warn = lambda text: print(f"warning: {text}", file=sys.stderr)  # noqa: E731
    return lambda ds, manifest: why_in_flight(ledger, model, ds, manifest, warn)  # type: ignore[arg-type]


def _promote(args: argparse.Namespace) -> int:
    from zipline_dagster.rollout.by_hand import promote

    module = args.module or project_code_location()
    model, configured = find_model(module, args.model), _configured(module)
    warehouse = configured[0]
    left: list[str] = []
    store = warehouse.store(model.model_artifact_base_uri)  # type: ignore[attr-defined]
    pointer = promote(
        store,  # type: ignore[arg-type]
        model,  # type: ignore[arg-type]
        args.ds,
        version=args.version,
        force=args.force,
        left=left,
        in_flight=_ledger_check(model, warehouse),  # type: ignore[arg-type]
    )
    return _moved(args, model, store, pointer, left, configured)


def _reproduce(args: argparse.Namespace) -> int:
    from zipline_dagster.storage.resources import warehouse_of
    from zipline_dagster.training.reproduce import reproduce
    from zipline_dagster.training.resources import RayJobsResource, TrainingLauncher

    module = args.module or project_code_location()
    defs = load_definitions(module)
    model = find_model(module, args.model)
    launcher = (getattr(defs, "resources", None) or {}).get("launcher")
    if not isinstance(launcher, TrainingLauncher):
        launcher = RayJobsResource()
    done = reproduce(model, args.ds, warehouse_of(defs), launcher)  # type: ignore[arg-type]
    print("\n".join(done.lines()))
    return 0


def _rollback(args: argparse.Namespace) -> int:
    from zipline_dagster.rollout.by_hand import rollback

    module = args.module or project_code_location()
    model, configured = find_model(module, args.model), _configured(module)
    left: list[str] = []
    store = configured[0].store(model.model_artifact_base_uri)  # type: ignore[attr-defined]
    pointer = rollback(store, model, left=left)  # type: ignore[arg-type]
    return _moved(args, model, store, pointer, left, configured)


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


def _backfill(args: argparse.Namespace) -> int:
    import dagster as dg

    from zipline_dagster.lineage.deployment import Deployment
    from zipline_dagster.lineage.internals import (
        daemon_running,
        launch_backfill,
    )
    from zipline_dagster.lineage.partitions import model_asset_key

    deployment = Deployment(args.url) if args.url else None
    module = args.module or project_code_location()
    defs: dg.Definitions = load_definitions(module)  # type: ignore[assignment]
    key = dg.AssetKey(args.model.split("/")) if "/" in args.model else model_asset_key(args.model)
    instance: dg.DagsterInstance = dagster_instance()  # type: ignore[assignment]
    # the instance's own daemon runs its backfills when one is running: never a second driver
    driving = deployment is None and not daemon_running(instance)
    if args.wait and driving:
        check_workspace(args.workspace)  # before any backfill is launched
    models = declared_models(module).values()
    plan = planned_backfill(args, defs, instance, key, models)
    refuse_drift(module, models, {k for k, _ in plan.steps} | {key})
    also = champions_to_judge(defs, instance, plan, key)
    if nothing_to_launch(plan, also):
        return 0
    title = f"{key.to_user_string()} {args.start_ds}..{args.end_ds}"
    if deployment is not None:
        backfill_id = deployment.launch(plan, title=title, also=also)
    else:
        backfill_id = launch_backfill(defs, instance, plan, title=title, also=also)
    print(f"backfill_id={backfill_id}", flush=True)
    if not args.wait and driving:
        print(
            "note: no dagster-daemon is running for this instance; start `make dev` "
            "(or pass --wait to run the backfill from this command)",
            file=sys.stderr,
        )
    if not args.wait:
        return 0
    return wait_for(args, instance, deployment, backfill_id, plan, also, driving=driving)


def check_workspace(workspace: str) -> None:
    if not Path(workspace).is_file():
        raise CliError(
            f"--workspace={workspace} is not a file; --wait without --url runs the "
            "backfill's runs from the code locations it names (the project's workspace.yaml; "
            "run from the project folder or pass its path)"
        )


def nothing_to_launch(plan: Any, also: list[Any]) -> bool:
    """Say ``backfill_id=none`` when every partition is fresh and no champion's gates
    changed; else say which champions judge again with nothing else planned."""
    if plan.empty and not also:
        going = " or left to the run writing it" if plan.in_flight else ""
        print(f"backfill_id=none (every partition is fresh{going})")
        return True
    for champion in also if plan.empty else []:
        print(f"  {champion.to_user_string()}: its gates changed; it judges the champion again",
              file=sys.stderr)  # fmt: skip
    return False


def planned_backfill(
    args: argparse.Namespace, defs: Any, instance: Any, key: Any, models: Any
) -> Any:
    """The plan for ``key``'s days ``--start-ds``..``--end-ds`` under the ledger's rule
    (what storage holds and Dagster never recorded is recorded first, each said on
    stderr), printed on stderr."""
    from zipline_dagster.lineage.backfill import model_partitions, plan_backfill
    from zipline_dagster.lineage.ledger import Ledger
    from zipline_dagster.rollout.assets import gate_judge
    from zipline_dagster.storage.resources import warehouse_of

    parts = model_partitions(defs, key, args.start_ds, args.end_ds)
    ledger = Ledger(instance, judge=gate_judge(*models, store=warehouse_of(defs).store))
    plan = plan_backfill(defs, instance, key, parts, ledger=ledger)
    for diff in ledger.recorded:
        where = f"{diff.key.to_user_string()} {diff.partition}"
        print(f"note: {where}: {diff.describe()}", file=sys.stderr)
    print(f"plan for {key.to_user_string()} {args.start_ds}..{args.end_ds}:", file=sys.stderr)
    print(plan.describe(), file=sys.stderr)
    return plan


def refuse_drift(module: str, models: object, planned: set[object]) -> None:
    """A model whose trainer source moved past its pin refuses to train: say so before
    anything runs (rather than after its upstream partitions were computed), and also
    when every partition is fresh (they were trained from the pinned archive, which the
    source no longer builds)."""
    from zipline_dagster.lineage.partitions import model_asset_key

    trains = [m for m in models if model_asset_key(m.name) in planned]  # type: ignore[attr-defined]
    drifts: list = project_drift(module, trains)
    if drifts:
        raise CliError(
            "nothing was launched: "
            + "; ".join(d.describe() for d in drifts)
            + ". Its partitions would refuse to train"
        )


def champions_to_judge(defs: Any, instance: Any, plan: Any, key: Any) -> list[Any]:
    """The champion of each model the plan trains (it judges the new partitions, in the
    backfill), and the target model's champion when its gates changed (it judges itself
    again, also when nothing else is planned)."""
    from zipline_dagster.lineage.backfill import code_version_changed
    from zipline_dagster.lineage.partitions import champion_asset_key, model_asset_key

    graph = defs.resolve_asset_graph()
    trained = [k for k, _ in plan.steps if k == model_asset_key(k.path[-1])]
    also = []
    for model_key in dict.fromkeys([*trained, key]):
        champion = champion_asset_key(model_key.path[-1])
        if graph.has(champion) and (
            model_key in trained or code_version_changed(instance, graph, champion)
        ):
            also.append(champion)
    return also


def wait_for(
    args: argparse.Namespace,
    instance: Any,
    deployment: Any,
    backfill_id: str,
    plan: Any,
    also: list[Any],
    *,
    driving: bool,
) -> int:
    """``--wait``: follow the backfill to its end (through the webserver with ``--url``,
    else driving its runs here or following the instance's daemon); its status and the
    champions it judged on stdout."""
    from zipline_dagster.lineage.internals import drive_backfill, failed_runs

    targets: set[tuple[Any, str | None]] = {(k, p) for k, parts in plan.steps for p in parts}
    targets |= {(k, None) for k in also}
    try:
        if deployment is not None:
            status = deployment.wait(
                backfill_id, log=lambda m: print(f"  {m}", file=sys.stderr), targets=targets
            )
        else:
            output = Path(instance.root_directory) / "logs" / f"backfill-{backfill_id}.log"
            if driving:  # else the instance's daemon runs them, with its own output
                print(f"  the runs' output: {output}", file=sys.stderr, flush=True)
            with _output_to(output) as stderr:
                status = drive_backfill(
                    instance,
                    backfill_id,
                    workspace_file=args.workspace,
                    targets=targets,
                    log=lambda m: os.write(stderr, f"  {m}\n".encode()),
                )
    except KeyboardInterrupt:
        daemon = "its daemon" if deployment else "a dagster-daemon of this instance (`make dev`)"
        print(
            f"interrupted: stopped waiting. Backfill {backfill_id} goes on without this "
            f"command: the runs already launched finish, and {daemon} launches the rest. To stop "
            "it, cancel it in the Dagster UI (Overview, Backfills).",
            file=sys.stderr,
        )
        return 130
    print(f"status={status}")
    done = status in ("COMPLETED_SUCCESS", "COMPLETED")
    for line in [] if done or deployment is not None else failed_runs(instance, backfill_id):
        print(f"  {line}", file=sys.stderr)
    for champion in also if done else []:
        print(champion_line(instance, champion))
    return 0 if done else 1


@contextlib.contextmanager
def _output_to(path: Path) -> Iterator[int]:
    """What this process and the ones it starts write to stdout and stderr (the runs'
    logs, Dagster's code server) goes to ``path`` meanwhile, so that stdout holds only
    the command's ``key=value`` lines and stderr its progress; yields the real stderr."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    try:
        yield saved[1]
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for target, fd in enumerate(saved, start=1):
            os.dup2(fd, target)
            os.close(fd)


def champion_line(instance: object, champion: object) -> str:
    """``champion=VERSION/DS (why)`` from the champion asset's latest materialization."""
    import dagster as dg

    assert isinstance(instance, dg.DagsterInstance) and isinstance(champion, dg.AssetKey)
    event = instance.get_latest_materialization_event(champion)
    mat = event.asset_materialization if event is not None else None
    if mat is None:
        return "champion=unknown (the champion asset has no materialization)"
    md = {k: v.value for k, v in mat.metadata.items()}
    where = f"{md['version']}/{md['ds']}" if "ds" in md else "none"
    return f"champion={where} ({md.get('reason')})"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zipline-dagster", description=(__doc__ or "").replace("``", "")
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser(
        "build-trainer", help="build a trainer archive, upload it, print its version"
    )
    p.add_argument("path", help="trainer package folder (holds setup.py)")
    p.add_argument(
        "--model-name", required=True, help="names the archive: {base}/builds/{name}-{version}.zip"
    )
    p.add_argument("--base", help="model_artifact_base_uri (file:///... or s3://...)")
    p.add_argument(
        "--check",
        action="store_true",
        help="only check that the source builds to the version trainers.lock pins",
    )
    p.set_defaults(func=_build_trainer)

    p = sub.add_parser(
        "new-model",
        help="scaffold a model: its trainer (from the reference one), its defs file, its pin",
    )
    p.add_argument("name", help="the model's name (names its trainer, archive and defs module)")
    p.add_argument("--table", default="ctr.training_v1", help="the training table it reads")
    p.add_argument(
        "--task",
        choices=["classification", "regression"],
        default="classification",
        help="what it predicts: its reference trainer, gate and monitored metrics",
    )
    p.add_argument(
        "--features",
        help="comma-separated columns of the table the trainer reads (besides the label; "
        "default: the demo table's for the task)",
    )
    p.add_argument("--label", help="the label column (default: label; price_log for regression)")
    p.add_argument(
        "--keys",
        default="view_id",
        help="comma-separated columns a scored row is joined to its label on (monitoring)",
    )
    p.add_argument("--window", type=int, default=4, help="training window, in days")
    p.add_argument(
        "--threshold",
        type=float,
        help="the gate: holdout_auc >= it (default 0.6); holdout_r2 >= it for regression (0.5)",
    )
    p.add_argument("--template", help="the trainers/ folder to copy (default: the task's)")
    p.add_argument("--module", help="code location package (default: the project's)")
    p.set_defaults(func=_new_model)

    p = sub.add_parser(
        "check",
        help="fail when a model's trainer source builds to another version than it pins",
    )
    p.add_argument("--module", help="code location module (default: the project's)")
    p.set_defaults(func=_check)

    p = sub.add_parser(
        "verify-trainer", help="re-hash a stored archive; fail on mismatch or absence"
    )
    p.add_argument("--model-name", required=True)
    p.add_argument("--version", required=True)
    p.add_argument("--base", required=True)
    p.set_defaults(func=_verify_trainer)

    p = sub.add_parser("ray", help="the embedded local Ray head: up | down | status")
    p.add_argument("action", choices=["up", "down", "status"])
    p.add_argument("--state-dir", default=None, help="default: $ZIPLINE_HOME/ray")
    p.add_argument("--num-cpus", type=int, default=None)
    p.set_defaults(func=_ray)

    p = sub.add_parser(
        "backfill",
        help="backfill a model's partitions, with every missing or stale upstream partition first",
    )
    p.add_argument("model", help="model name (models/NAME) or an asset key a/b")
    p.add_argument("--start-ds", required=True)
    p.add_argument("--end-ds", required=True)
    p.add_argument(
        "--wait",
        action="store_true",
        help="wait until the backfill ends, showing its progress (without --url, this "
        "command runs it as the daemon would, or follows the instance's daemon if one runs)",
    )
    p.add_argument(
        "--url",
        help="the deployment's Dagster webserver (http://host:3000): the backfill is launched "
        "and followed through its GraphQL API, and its daemon runs it",
    )
    p.add_argument(
        "--module",
        default=None,
        help="code location module (default: the project's, from pyproject.toml [tool.dg])",
    )
    p.add_argument("--workspace", default="workspace.yaml", help="workspace file the runs load")
    p.set_defaults(func=_backfill)

    module_help = "code location module (default: the project's, from pyproject.toml [tool.dg])"
    p = sub.add_parser(
        "promote",
        help="point a model's champion at a trained partition (refused if a gate failed)",
    )
    p.add_argument("model", help="model name")
    p.add_argument("--ds", required=True, help="the partition (day) to promote")
    p.add_argument("--version", default=None, help="trainer version (default: the model's)")
    p.add_argument("--force", action="store_true", help="promote despite failed gates (recorded)")
    p.add_argument("--module", default=None, help=module_help)
    p.set_defaults(func=_promote)

    p = sub.add_parser(
        "reproduce",
        help="train a model partition again at the Iceberg snapshot it read (a new attempt, "
        "not promoted) and print each metric beside the recorded one",
    )
    p.add_argument("model", help="model name")
    p.add_argument("ds", help="the partition (day)")
    p.add_argument("--module", default=None, help=module_help)
    p.set_defaults(func=_reproduce)

    p = sub.add_parser("rollback", help="point a model's champion back at the one it replaced")
    p.add_argument("model", help="model name")
    p.add_argument("--module", default=None, help=module_help)
    p.set_defaults(func=_rollback)
    return parser


def user_errors() -> tuple[type[Exception], ...]:
    """The library's errors about what a user gave or has (each message names the thing,
    the value and what is accepted): said as one ``error:`` line, not a traceback."""
    from zipline_dagster.declarations.model import ModelSpecError
    from zipline_dagster.lineage.backfill import BackfillError, RunFailed
    from zipline_dagster.rollout.champion import ChampionError
    from zipline_dagster.settings import SettingsError
    from zipline_dagster.storage.blobs import BlobStorageError
    from zipline_dagster.storage.catalog import WarehouseError
    from zipline_dagster.training.archive import ArchiveVerificationError, TrainerArchiveError
    from zipline_dagster.training.launchers.ray_head import RayHeadError
    from zipline_dagster.training.reproduce import ReproduceError

    return (
        ArchiveVerificationError,
        TrainerArchiveError,
        BlobStorageError,
        RayHeadError,
        BackfillError,
        RunFailed,
        ModelSpecError,
        SettingsError,
        CliError,
        ChampionError,
        ReproduceError,
        WarehouseError,
    )


def main(argv: Sequence[str] | None = None) -> int:
    from zipline_dagster.errors import describe

    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except user_errors() as exc:
        print(f"error: {describe(exc)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
