"""``make demo``: the listing-CTR pipeline end to end on embedded defaults.

Builds and uploads the trainer archive, then materializes, upstream first, every
missing or stale partition the model range needs (synthetic events, features and labels
on local Spark, the training table, and one Ray Job for the model's partitions on the
embedded Ray head, each partition with its blocking checks), moves the champion, scores
the day after each trained partition with it (one Ray Job for those days) and monitors
those scores against the day's labels. It prints each trained partition's holdout AUC and checks, the
champion, and the realized AUC per scored day. A second run finds everything fresh and
does nothing.

``scripts/demo.py`` runs it; ``scripts/demo.py --cluster WEB_URL`` runs ``make
demo-cluster``'s (``scripts/cluster.py demo``). It is not a module of the code location
(``zipline_dagster.defs``) so that a code location that does not load (a bad setting) is
said in one ``error:`` line, as every error a user can fix is.
"""

import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    import dagster as dg

    from zipline_dagster.declarations.deployment import Metric
    from zipline_dagster.declarations.model import Model
    from zipline_dagster.declarations.transforms import ModelTransforms
    from zipline_dagster.storage.blobs import BlobStore


def _recent_days() -> tuple[str, str]:
    """The demo's four model partitions, ending the day before yesterday (UTC): the day
    after each is scored, and yesterday is the newest daily partition there is. Dagster's
    "Plots" by partition view draws the newest 120 partitions of an asset only, so a demo
    of days months back would plot nothing there."""
    import datetime as dt

    end = dt.datetime.now(dt.UTC).date() - dt.timedelta(days=2)
    return (end - dt.timedelta(days=3)).isoformat(), end.isoformat()


MODEL_START = os.environ.get("ZIPLINE_DEMO_START") or _recent_days()[0]
MODEL_END = os.environ.get("ZIPLINE_DEMO_END") or _recent_days()[1]
TRAINERS = Path(__file__).resolve().parents[1] / "trainers"


def main(argv: list[str]) -> int:
    from zipline_dagster.cli import user_errors
    from zipline_dagster.errors import describe

    try:
        if argv[:1] == ["--cluster"] and len(argv) == 2:
            return cluster_main(argv[1])
        if argv:
            print("usage: scripts/demo.py [--cluster WEB_URL]", file=sys.stderr)
            return 2
        return _main()
    except user_errors() as exc:  # a failed step: Dagster's log of it is above
        print(f"error: {describe(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(
            "\ninterrupted: every partition committed so far stays, recorded or not (the next "
            "run records it from storage); `make demo` again continues from there",
            file=sys.stderr,
        )
        return 130


def demo_models() -> list[tuple["Model", "ModelTransforms"]]:
    """The demo's models, each with its scores table: the CTR classifier and the price
    regressor, on the same training table."""
    from zipline_dagster.defs.listing_ctr import listing_ctr_model, listing_scores
    from zipline_dagster.defs.listing_price import listing_price_model, listing_prices

    return [(listing_ctr_model, listing_scores), (listing_price_model, listing_prices)]


def publish(models: list["Model"]) -> str | None:
    """Build and upload each model's trainer archive; why not, when its source no longer
    builds the version its defs file pins."""
    from zipline_dagster.jobs.archive import publish_trainer_archive

    for model in models:
        published = publish_trainer_archive(
            TRAINERS / model.name, model_name=model.name, base=model.model_artifact_base_uri
        )
        if published.version != model.version:
            return (
                f"trainers/{model.name} now builds version {published.version}, but its defs "
                f"file pins {model.version}; run `zipline-dagster build-trainer "
                f"trainers/{model.name} --model-name {model.name} --base "
                f"{model.model_artifact_base_uri}` to pin it"
            )
        print(f"      {model.name} {published.version} at {published.uri}", flush=True)
    return None


class DemoStop(RuntimeError):
    """The demo cannot go on; the message is its one ``error:`` line."""


def log(message: str) -> None:
    print(f"      {message}", flush=True)


def _main() -> int:
    import dagster as dg

    from zipline_dagster.defs import defs
    from zipline_dagster.storage.days import shift_day
    from zipline_dagster.storage.resources import warehouse_of

    t0 = time.monotonic()
    pairs = demo_models()
    models = [m for m, _ in pairs]
    print(f"[1/5] trainer archives from {TRAINERS}", flush=True)
    instance = dg.DagsterInstance.get()
    try:
        if (why := publish(models)) is not None:
            raise DemoStop(why)
        parts = train(defs, instance, models)
        print("[3/5] champions", flush=True)
        judge_champions(defs, instance, models, parts)
        # Day ds is scored by the model of ds-1, so the scored days follow the trained ones.
        scored = [shift_day(ds, 1) for ds in parts]
        score(defs, instance, pairs, scored)
    except DemoStop as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"[5/5] trained partitions ({time.monotonic() - t0:.0f}s):", flush=True)
    warehouse = warehouse_of(defs)
    unfinished = []
    for model, transforms in pairs:
        store = warehouse.store(model.model_artifact_base_uri)
        unfinished += summarize(instance, store, model, transforms, parts, scored)
    if unfinished:
        print(f"error: {len(unfinished)} partitions are not finished", file=sys.stderr)
        return 1
    mlflow_summary(defs, models)
    print(
        "open the Dagster UI with `make dev` (http://127.0.0.1:3000); stop the embedded Ray head with `make ray-down`"
    )
    return 0


def train(
    defs: "dg.Definitions", instance: "dg.DagsterInstance", models: list["Model"]
) -> list[str]:
    """Each model's partitions of the demo's range, with what they need upstream (planned
    by the ledger's rule: what storage holds is recorded, not recomputed); the days."""
    from zipline_dagster.lineage.backfill import model_partitions, plan_backfill
    from zipline_dagster.lineage.internals import execute_plan_in_process
    from zipline_dagster.lineage.ledger import Ledger
    from zipline_dagster.lineage.partitions import model_asset_key
    from zipline_dagster.rollout.assets import gate_judge
    from zipline_dagster.storage.resources import warehouse_of

    warehouse = warehouse_of(defs)
    parts: list[str] = []
    for model in models:
        key = model_asset_key(model.name)
        parts = model_partitions(defs, key, MODEL_START, MODEL_END)
        ledger = Ledger(instance, judge=gate_judge(*models, store=warehouse.store))
        plan = plan_backfill(defs, instance, key, parts, ledger=ledger)
        for diff in ledger.recorded:
            print(f"note: {diff.key.to_user_string()} {diff.partition}: {diff.describe()}")
        print(
            f"[2/5] plan for {key.to_user_string()} {MODEL_START}..{MODEL_END}:\n{plan.describe()}",
            flush=True,
        )
        execute_plan_in_process(defs, instance, plan, log=log)
    return parts


def judge_champions(
    defs: "dg.Definitions", instance: "dg.DagsterInstance", models: list["Model"], parts: list[str]
) -> None:
    """Evaluate each model's champion; stop when a model has no partition of ``parts``
    passing its gates (nothing could score the days after them)."""
    from zipline_dagster.lineage.partitions import champion_asset_key
    from zipline_dagster.storage.resources import warehouse_of

    job = defs.resolve_implicit_global_asset_job_def()
    quiet = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
    moved = job.execute_in_process(
        run_config=quiet,
        instance=instance,
        asset_selection=[champion_asset_key(m.name) for m in models],
        raise_on_error=False,
    )
    if not moved.success:
        raise DemoStop(f"a champion asset failed; see Dagster run {moved.run_id}")
    for model in models:
        store = warehouse_of(defs).store(model.model_artifact_base_uri)
        if (why := none_passes(store, model, parts)) is not None:
            raise DemoStop(why)


def score(
    defs: "dg.Definitions",
    instance: "dg.DagsterInstance",
    pairs: list[tuple["Model", "ModelTransforms"]],
    scored: list[str],
) -> None:
    """Each scores table's ``scored`` days, then their monitoring."""
    from zipline_dagster.lineage.backfill import plan_backfill
    from zipline_dagster.lineage.internals import execute_plan_in_process
    from zipline_dagster.lineage.partitions import table_asset_key
    from zipline_dagster.scoring.monitoring import monitoring_asset_key

    for _, transforms in pairs:
        for key in (table_asset_key(transforms.table), monitoring_asset_key(transforms)):
            step = plan_backfill(defs, instance, key, scored)
            print(f"[4/5] plan for {key.to_user_string()}:\n{step.describe()}", flush=True)
            execute_plan_in_process(defs, instance, step, log=log)


def mlflow_summary(defs: "dg.Definitions", models: list["Model"]) -> None:
    """``make demo-mlflow``: each model's runs and champion alias in MLflow."""
    from zipline_dagster.tracking import mlflow_of

    tracker = mlflow_of(defs).tracker(lambda m: print(f"warning: {m}"))
    if tracker is not None:
        for model in models:
            for line in tracker.summary(model.name) or []:
                print(f"      MLflow: {line}")


def none_passes(store: "BlobStore", model: "Model", parts: list[str]) -> str | None:
    """Why no day after ``parts`` can be scored: no partition of them passes its gates
    (each threshold none meets, with the best value any partition had), or None."""
    from zipline_dagster.rollout import gates
    from zipline_dagster.storage import champion_pointer as cp
    from zipline_dagster.storage.paths import model_partition_uri

    if any(all(r.passed for r in gates.evaluate(model, store, ds).values()) for ds in parts):
        return None
    reports = {
        ds: gates.read_partition_report(store, model_partition_uri(model, ds)) for ds in parts
    }
    failed = [
        why
        for metric in model.rollout.rollout_metric_thresholds
        if (why := unmet(metric, reports)) is not None
    ]
    champion = cp.read_champion(store, model)
    serving = (
        f"the champion {champion.where} keeps serving, and"
        if champion is not None
        else "there is no champion, and"
    )
    return (
        f"{model.name}: no partition of {parts[0]}..{parts[-1]} passed its gates: "
        f"{'; '.join(failed) or 'its report or manifest gates'}; {serving} nothing was scored"
    )


def unmet(metric: "Metric", reports: "Mapping[str, Mapping[str, Any] | None]") -> str | None:
    """``metric`` with the best value any report has, when no report meets it."""
    from zipline_dagster.storage.artifacts import report_metrics

    held = {ds: report_metrics(r or {}).get(metric.name) for ds, r in reports.items()}
    values = [(v, ds) for ds, v in held.items() if v is not None]
    if any(metric.passes(v) for v, _ in values):
        return None
    if not values:
        return f"{metric.describe()} (no partition reports {metric.name})"
    value, ds = max(values) if metric.is_minimum else min(values)
    return f"{metric.describe()} (best {metric.name} {value:.4f} on {ds})"


def summarize(
    instance: object,
    store: "BlobStore",
    model: "Model",
    transforms: "ModelTransforms",
    parts: list[str],
    scored: list[str],
) -> list[str]:
    """Print each trained partition of ``model`` (its holdout metrics and checks), the
    champion and each scored day's realized metrics, read from the code location's
    warehouse ``store``; return the partitions and days that are not finished."""

    import dagster as dg

    from zipline_dagster.declarations.tasks import REALIZED_METRICS, task_of
    from zipline_dagster.lineage.partitions import model_asset_key, scored_by, table_asset_key
    from zipline_dagster.rollout import champion as ch
    from zipline_dagster.rollout import gates
    from zipline_dagster.scoring.drift import drift_line
    from zipline_dagster.scoring.monitoring import monitoring_asset_key
    from zipline_dagster.storage import champion_pointer as cp
    from zipline_dagster.storage.artifacts import read_report, report_metrics
    from zipline_dagster.storage.manifests import model_partition
    from zipline_dagster.storage.paths import MANIFEST_NAME, model_partition_uri

    assert isinstance(instance, dg.DagsterInstance)
    unfinished = []
    print(f"      {model.name}:")
    task = None
    for ds in parts:
        model_dir = model_partition_uri(model, ds)
        # Trained means a manifest on storage whose every checksum matches, whatever
        # Dagster recorded.
        if not model_partition(store, model_dir, ds, checksums=True).committed:
            print(f"      {ds}  NOT FINISHED: no complete {MANIFEST_NAME} in {model_dir}")
            unfinished.append(ds)
            continue
        report = read_report(store, model_dir)
        task = task_of(model.task, report)
        verdicts = gates.evaluate(model, store, ds)
        failed = [n for n, r in verdicts.items() if not r.passed]
        checks = "checks passed" if not failed else "checks FAILED: " + ", ".join(failed)
        print(
            f"      {ds}  holdout {_metrics(report_metrics(report), 'holdout_', REALIZED_METRICS[task])}"
            f"  {checks}  rows {report['train']['rows']}+{report['holdout']['rows']}  {model_dir}"
        )
        print(f"{'':18}cost {_cost(_latest_metadata(instance, model_asset_key(model.name), ds))}")
    champion = cp.read_champion(store, model)
    if champion is None:
        print("      champion: none (no partition passes every gate)")
    else:
        keys = REALIZED_METRICS[task] if task is not None else ()
        print(
            f"      champion: {champion.where} "
            f"(holdout {_metrics(champion.metrics, 'holdout_', keys)}; "
            f"{champion.why}) -> {cp.champion_uri(model)}"
        )
        if failing := ch.fails_current_gates(model, champion):
            print(f"      warning: the champion fails the current gates: {failing[0].summary}")
    print("      scored days (realized on that day's labels):")
    for ds in scored:
        realized = _latest_metadata(instance, monitoring_asset_key(transforms), ds)
        if realized is None:
            print(f"      {ds}  NOT MONITORED")
            unfinished.append(ds)
            continue
        keys = REALIZED_METRICS[task_of(model.task, {"task": realized.get("task")})]
        print(
            f"      {ds}  realized {_metrics(realized, 'realized/', keys)}  on "
            f"{realized.get('rows_joined')} labelled rows, scored by {model.name} {scored_by(realized)}"
        )
        scores = _latest_metadata(instance, table_asset_key(transforms.table), ds) or {}
        print(f"{'':18}drift {drift_line(scores)}; cost {_cost(scores)}")
    return unfinished


def _metrics(values: "Mapping[str, object]", prefix: str, keys: "Iterable[str]") -> str:
    """``AUC 0.712 logloss 0.412 ...``: each of ``keys`` read as ``{prefix}{key}``."""
    shown = []
    for key in keys:
        value = values.get(f"{prefix}{key}")
        label = key.upper() if key in ("auc", "rmse", "mae") else ("R²" if key == "r2" else key)
        shown.append(f"{label} {value:.3f}" if isinstance(value, (int, float)) else f"{label} n/a")
    return " ".join(shown)


def cluster_main(web_url: str) -> int:
    """``make demo-cluster``: the same demo against a deployment (``make cluster-up``),
    through its own paths: the trainer archive published to its object store, then each
    step submitted with ``zipline-dagster backfill --url`` to its webserver, which its
    daemon runs (waited for, with progress) -- nothing is materialized here."""
    import subprocess

    import dagster as dg

    from zipline_dagster.defs import defs
    from zipline_dagster.scoring.monitoring import monitoring_asset_key
    from zipline_dagster.storage.days import days_between, shift_day
    from zipline_dagster.storage.resources import warehouse_of

    t0 = time.monotonic()
    pairs = demo_models()
    print(f"[1/3] trainer archives from {TRAINERS}", flush=True)
    if (why := publish([m for m, _ in pairs])) is not None:
        print(f"error: {why}", file=sys.stderr)
        return 1
    cli = str(Path(sys.executable).parent / "zipline-dagster")
    parts = [MODEL_START, MODEL_END]
    scored = [shift_day(MODEL_START, 1), shift_day(MODEL_END, 1)]
    for _, transforms in pairs:
        # one backfill a model: the monitored days, their scores, the models that score
        # them (day ds by ds-1) and everything upstream, then the champion
        target = monitoring_asset_key(transforms).to_user_string()
        print(
            f"[2/3] backfill of {target} {scored[0]}..{scored[1]} through {web_url}: upstream "
            "first, the models, their champion, the scores and their monitoring",
            flush=True,
        )
        done = subprocess.run(
            [cli, "backfill", target, "--start-ds", scored[0], "--end-ds", scored[1], "--url",
             web_url, "--wait"],
        )  # fmt: skip
        if done.returncode != 0:
            print(f"error: the backfill of {target} did not succeed", file=sys.stderr)
            return 1
    print(f"[3/3] trained partitions ({time.monotonic() - t0:.0f}s):", flush=True)
    instance = dg.DagsterInstance.get()
    unfinished = []
    for model, transforms in pairs:
        store = warehouse_of(defs).store(model.model_artifact_base_uri)
        trained, days = days_between(*parts), days_between(*scored)
        unfinished += summarize(instance, store, model, transforms, trained, days)
    return 1 if unfinished else 0


def _cost(metadata: "Mapping[str, object] | None") -> str:
    """``4.1s wall, 3.2 CPU-s, peak 212 MB`` from a partition's ``cost/*`` metadata."""
    md = metadata or {}
    shown = [
        f"{value:{fmt}}{unit}"
        for key, fmt, unit in (
            ("cost/wall_s", ".1f", "s wall"),
            ("cost/cpu_s", ".2f", " CPU-s"),
            ("cost/peak_mem_mb", ".0f", " MB peak"),
            ("cost/rows_per_s", ",.0f", " rows/s"),
        )
        if isinstance(value := md.get(key), (int, float))
    ]
    return ", ".join(shown) or "not recorded (the materialization was recorded from storage)"


def _latest_metadata(instance: object, key: object, ds: str) -> dict[str, object] | None:
    """The metadata values of the latest materialization of ``key`` partition ``ds``."""
    import dagster as dg

    from zipline_dagster.lineage.partitions import latest_materialization

    assert isinstance(instance, dg.DagsterInstance) and isinstance(key, dg.AssetKey)
    record = latest_materialization(instance, key, ds)
    mat = record.asset_materialization if record is not None else None
    return {k: v.value for k, v in mat.metadata.items()} if mat else None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
