"""``zipline-dagster backfill``: plan, launch and follow a backfill (see ``run_backfill``)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from zipline_dagster.cli.common import (
    CliError,
    dagster_instance,
    declared_models,
    load_definitions,
    project_code_location,
    project_drift,
)


def run_backfill(args: argparse.Namespace) -> int:
    """``zipline-dagster backfill``: plan a model's (or asset's) days under the ledger's
    rule, launch the backfill (here, or through ``--url``'s webserver), ``--wait`` for it."""
    # the project and the instance first: what is missing is said before Dagster loads
    module = args.module or project_code_location()
    instance = dagster_instance()

    import dagster as dg

    from zipline_dagster.lineage.deployment import Deployment
    from zipline_dagster.lineage.internals import (
        daemon_running,
        launch_backfill,
    )
    from zipline_dagster.lineage.partitions import model_asset_key

    assert isinstance(instance, dg.DagsterInstance)
    deployment = Deployment(args.url) if args.url else None
    defs: dg.Definitions = load_definitions(module)  # type: ignore[assignment]
    key = dg.AssetKey(args.model.split("/")) if "/" in args.model else model_asset_key(args.model)
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
