"""``zipline-dagster``: build and verify trainer archives, pin the job-side runtime, run the
embedded Ray head, backfill, move a model's champion pointer (promote, rollback)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from zipline_dagster.cli.backfill import run_backfill
from zipline_dagster.cli.common import (
    CliError,
    declared_models,
    find_model,
    instance_at_dagster_home,
    load_definitions,
    project_code_location,
    project_drift,
)
from zipline_dagster.cli.runtime import add_parser as add_runtime_parser

if TYPE_CHECKING:  # the CLI imports the platform lazily, per command
    from zipline_dagster.storage.champion_pointer import ChampionPointer


def _build_trainer(args: argparse.Namespace) -> int:
    from zipline_dagster.jobs.archive import build_trainer_archive, publish_trainer_archive
    from zipline_dagster.jobs.pins import find_lock, read_lock, record_pin

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

    # Dagster only once the scaffold is written: a refused name or flag is said at once
    from zipline_dagster.declarations.model import MODEL_NAME_ACCEPTED, MODEL_NAME_RE
    from zipline_dagster.jobs.archive import publish_trainer_archive
    from zipline_dagster.scaffold import Scaffold
    from zipline_dagster.settings import artifact_base_uri

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
    written = scaffold.write(
        defs_file, module, template=args.template, load=lambda: load_definitions(module)
    )  # a ScaffoldError is a user error: one line, with its cause
    published = publish_trainer_archive(written.trainer, model_name=name, base=artifact_base_uri())
    print(f"wrote {written.trainer}/ (from {written.template}) and {defs_file}", file=sys.stderr)
    print(
        f"pinned {name} to {published.version} in {written.lock}; uploaded {published.uri}",
        file=sys.stderr,
    )
    import dagster as dg

    from zipline_dagster.lineage.partitions import model_asset_key

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


def _check(args: argparse.Namespace) -> int:
    module = args.module or project_code_location()
    models = declared_models(module).values()
    drifts: list = project_drift(module, models)
    for drift in drifts:
        print(f"error: {drift.describe()}", file=sys.stderr)
    if drifts:
        return 1
    print(f"ok: {len(models)} model(s) of {module}; every trainer in the project builds to its pin")
    _runtime_note(module)
    return 0


def _runtime_note(module: str) -> None:
    """Says when the runtime installed here is not the one the project pins: jobs keep
    running the pinned one (nothing is wrong), and ``adopt-runtime`` would move to it."""
    import importlib

    from zipline_dagster.jobs.pins import find_lock, read_runtime_pin
    from zipline_dagster.packaging import installed_runtime

    lock = find_lock(str(importlib.import_module(module).__file__))
    pin, installed = read_runtime_pin(lock), installed_runtime()
    if pin is not None and pin.version != installed.version:
        print(
            f"note: {lock} pins runtime {pin.version} (protocol {pin.protocol}); the one "
            f"installed here builds to {installed.version} (protocol {installed.protocol}). "
            "Jobs keep running the pinned one; `zipline-dagster adopt-runtime` adopts it "
            "and names the models it re-versions",
            file=sys.stderr,
        )


def _verify_trainer(args: argparse.Namespace) -> int:
    from zipline_dagster.jobs.archive import verify_trainer_archive

    uri = verify_trainer_archive(base=args.base, model_name=args.model_name, version=args.version)
    print(f"ok: {uri} hashes to {args.version}")
    return 0


def _ray(args: argparse.Namespace) -> int:
    from zipline_dagster.jobs.launchers.ray_head import LocalRayHead

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


def _configured(module: str) -> tuple[object, object]:
    """The code location's warehouse and MLflow resources, as its runs use them (the
    settings' where it has none)."""
    from zipline_dagster.storage.resources import warehouse_of
    from zipline_dagster.tracking import mlflow_of

    defs = load_definitions(module)
    return warehouse_of(defs), mlflow_of(defs)  # type: ignore[arg-type]


def _print_pointer(pointer: ChampionPointer) -> None:
    import json

    print(json.dumps(pointer.to_json(), indent=2, sort_keys=True))


def _moved(
    args: argparse.Namespace,
    model: object,
    store: object,
    pointer: ChampionPointer,
    left: list[str],
    configured: tuple[object, object],
) -> int:
    """Say where the champion moved (and any lock left behind), move MLflow's alias
    after it when the code location has MLflow on, print the pointer."""
    from zipline_dagster.events import ChampionEvaluated
    from zipline_dagster.lineage.partitions import model_asset_key
    from zipline_dagster.rollout.assets import judged_gates
    from zipline_dagster.rollout.champion import lock_left_behind, why_pinned_attempt_gone
    from zipline_dagster.tracking.listener import sync

    print(
        f"{args.model} champion -> {pointer.where} ({pointer.why})",
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
        event = ChampionEvaluated(
            model,  # type: ignore[arg-type]
            model_asset_key(model.name).to_user_string(),  # type: ignore[attr-defined]
            store,  # type: ignore[arg-type]
            pointer,
            moved=True,
            judged=judged_gates(store, model),  # type: ignore[arg-type]
            attempt_gone=lambda p: bool(why_pinned_attempt_gone(store, p)),  # type: ignore[arg-type]
        )
        synced = sync(tracker, event)
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
        return lambda partition: print(note, file=sys.stderr)
    ledger = Ledger(instance, judge=gate_judge(model, store=warehouse.store))  # type: ignore[arg-type, attr-defined]
    warn = lambda text: print(f"warning: {text}", file=sys.stderr)  # noqa: E731
    return lambda partition: why_in_flight(ledger, model, partition, warn)  # type: ignore[arg-type]


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
    from zipline_dagster.jobs.resources import JobLauncher, RayJobsResource
    from zipline_dagster.storage.resources import warehouse_of
    from zipline_dagster.training.reproduce import reproduce

    module = args.module or project_code_location()
    defs = load_definitions(module)
    model = find_model(module, args.model)
    launcher = (getattr(defs, "resources", None) or {}).get("launcher")
    if not isinstance(launcher, JobLauncher):
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

    add_runtime_parser(sub)

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
    p.set_defaults(func=run_backfill)

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


#: The library's errors about what a user gave or has (each message names the thing, the
#: value and what is accepted), by defining module: said as one ``error:`` line.
USER_ERRORS = (
    ("zipline_dagster.jobs.archive", "ArchiveVerificationError"),
    ("zipline_dagster.jobs.archive", "TrainerArchiveError"),
    ("zipline_dagster.storage.blob_base", "BlobStorageError"),
    ("zipline_dagster.jobs.launchers.ray_head", "RayHeadError"),
    ("zipline_dagster.lineage.freshness", "BackfillError"),
    ("zipline_dagster.lineage.backfill", "RunFailed"),
    ("zipline_dagster.declarations.errors", "ModelSpecError"),
    ("zipline_dagster.settings", "SettingsError"),
    ("zipline_dagster.cli.common", "CliError"),
    ("zipline_dagster.rollout.champion", "ChampionError"),
    ("zipline_dagster.training.reproduce", "ReproduceError"),
    ("zipline_dagster.storage.catalog", "WarehouseError"),
    ("zipline_dagster.scaffold", "ScaffoldError"),
    ("zipline_dagster.jobs.runtime", "RuntimeShipError"),
    ("zipline_dagster.packaging", "RuntimeBuildError"),
)


def user_errors() -> tuple[type[Exception], ...]:
    """The ``USER_ERRORS`` this process can have raised: those of the modules it imported.
    An error of a module never imported cannot be in flight, and importing them all to
    catch one would load Dagster (seconds of CPU) for a refused flag."""
    loaded = (getattr(sys.modules.get(m), name, None) for m, name in USER_ERRORS)
    return tuple(cls for cls in loaded if cls is not None)  # (a module mid-import: not yet)


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
