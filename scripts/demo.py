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
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from zipline_dagster.storage.blobs import BlobStore

MODEL_START = os.environ.get("ZIPLINE_DEMO_START", "2026-07-11")
MODEL_END = os.environ.get("ZIPLINE_DEMO_END", "2026-07-14")
TRAINER = Path(__file__).resolve().parents[1] / "trainers" / "listing_ctr_model"


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


def _main() -> int:
    import dagster as dg

    from zipline_dagster.defs import defs
    from zipline_dagster.defs.listing_ctr import listing_ctr_model, listing_scores
    from zipline_dagster.lineage.backfill import model_partitions, plan_backfill
    from zipline_dagster.lineage.internals import execute_plan_in_process
    from zipline_dagster.lineage.ledger import Ledger
    from zipline_dagster.lineage.partitions import (
        champion_asset_key,
        model_asset_key,
        table_asset_key,
    )
    from zipline_dagster.rollout.assets import gate_judge
    from zipline_dagster.scoring.monitoring import monitoring_asset_key
    from zipline_dagster.storage.resources import warehouse_of
    from zipline_dagster.storage.tables import shift_day
    from zipline_dagster.tracking import mlflow_of
    from zipline_dagster.training.archive import publish_trainer_archive

    t0 = time.monotonic()
    model = listing_ctr_model
    print(f"[1/5] trainer archive from {TRAINER}", flush=True)
    published = publish_trainer_archive(
        TRAINER, model_name=model.name, base=model.model_artifact_base_uri
    )
    if published.version != model.version:
        print(
            f"error: trainers/{model.name} now builds version {published.version}, but "
            f"zipline_dagster/defs/listing_ctr.py pins {model.version}; update LISTING_CTR_MODEL_VERSION",
            file=sys.stderr,
        )
        return 1
    print(f"      version {published.version} at {published.uri}", flush=True)

    instance = dg.DagsterInstance.get()
    key = model_asset_key(model.name)
    parts = model_partitions(defs, key, MODEL_START, MODEL_END)
    warehouse = warehouse_of(defs)
    ledger = Ledger(instance, judge=gate_judge(model, store=warehouse.store))
    plan = plan_backfill(defs, instance, key, parts, ledger=ledger)
    for diff in ledger.recorded:
        print(f"note: {diff.key.to_user_string()} {diff.partition}: {diff.describe()}")
    print(
        f"[2/5] plan for {key.to_user_string()} {MODEL_START}..{MODEL_END}:\n{plan.describe()}",
        flush=True,
    )
    execute_plan_in_process(defs, instance, plan, log=lambda m: print(f"      {m}", flush=True))

    log = lambda m: print(f"      {m}", flush=True)  # noqa: E731
    print("[3/5] champion", flush=True)
    job = defs.resolve_implicit_global_asset_job_def()
    quiet = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
    moved = job.execute_in_process(
        run_config=quiet, instance=instance, asset_selection=[champion_asset_key(model.name)]
    )
    if not moved.success:
        print("error: the champion asset failed; see the Dagster run", file=sys.stderr)
        return 1
    # Day ds is scored by the model of ds-1, so the scored days follow the trained ones.
    scored = [shift_day(ds, 1) for ds in parts]
    for key in (table_asset_key(listing_scores.table), monitoring_asset_key(listing_scores)):
        step = plan_backfill(defs, instance, key, scored)
        print(f"[4/5] plan for {key.to_user_string()}:\n{step.describe()}", flush=True)
        execute_plan_in_process(defs, instance, step, log=log)

    print(f"[5/5] trained partitions ({time.monotonic() - t0:.0f}s):", flush=True)
    if summarize(instance, warehouse.store(model.model_artifact_base_uri), parts, scored):
        return 1
    tracker = mlflow_of(defs).tracker(lambda m: print(f"warning: {m}"))
    if tracker is not None:  # `make demo-mlflow`
        for line in tracker.summary(model.name) or []:
            print(f"      MLflow: {line}")
    print(
        "open the Dagster UI with `make dev` (http://127.0.0.1:3000); stop the embedded Ray head with `make ray-down`"
    )
    return 0


def summarize(
    instance: object, store: "BlobStore", parts: list[str], scored: list[str]
) -> list[str]:
    """Print each trained partition (its holdout AUC and checks), the champion and each
    scored day's realized AUC, read from the code location's warehouse ``store``; the
    partitions and days that are not finished."""

    import dagster as dg

    from zipline_dagster.defs.listing_ctr import listing_ctr_model as model
    from zipline_dagster.defs.listing_ctr import listing_scores
    from zipline_dagster.lineage.partitions import scored_by
    from zipline_dagster.rollout import champion as ch
    from zipline_dagster.rollout import gates
    from zipline_dagster.scoring.monitoring import monitoring_asset_key
    from zipline_dagster.storage.artifacts import is_committed, read_report
    from zipline_dagster.storage.paths import MANIFEST_NAME, model_partition_uri

    assert isinstance(instance, dg.DagsterInstance)
    unfinished = []
    for ds in parts:
        model_dir = model_partition_uri(model, ds)
        # Trained means a manifest on storage whose every checksum matches, whatever
        # Dagster recorded.
        if not is_committed(store, model_dir):
            print(f"      {ds}  NOT FINISHED: no complete {MANIFEST_NAME} in {model_dir}")
            unfinished.append(ds)
            continue
        report = read_report(store, model_dir)
        auc = report["holdout"]["metrics"]["auc"]
        auc_text = f"{auc:.3f}" if auc is not None else report["status"].get("holdout.auc", "n/a")
        verdicts = gates.evaluate(model, store, ds)
        failed = [n for n, r in verdicts.items() if not r.passed]
        checks = "checks passed" if not failed else "checks FAILED: " + ", ".join(failed)
        print(
            f"      {ds}  holdout AUC {auc_text}  {checks}  rows "
            f"{report['train']['rows']}+{report['holdout']['rows']}  {model_dir}"
        )
    champion = ch.read_champion(store, model)
    if champion is None:
        print("      champion: none (no partition passes every gate)")
    else:
        print(
            f"      champion: {champion['version']}/{champion['ds']} "
            f"(holdout AUC {champion['metrics'].get('holdout_auc', float('nan')):.3f}; "
            f"{champion['why']}) -> {ch.champion_uri(model)}"
        )
    print("      scored days (realized on that day's labels):")
    for ds in scored:
        realized = _latest_metadata(instance, monitoring_asset_key(listing_scores), ds)
        if realized is None:
            print(f"      {ds}  NOT MONITORED")
            unfinished.append(ds)
            continue
        auc = realized.get("realized/auc")
        auc_text = f"{auc:.3f}" if auc is not None else "n/a"
        print(
            f"      {ds}  realized AUC {auc_text}  on {realized.get('rows_joined')} labelled rows, "
            f"scored by {model.name} {scored_by(realized)}"
        )
    if unfinished:
        print(f"error: {len(unfinished)} partitions have no finished model", file=sys.stderr)
    return unfinished


def cluster_main(web_url: str) -> int:
    """``make demo-cluster``: the same demo against a deployment (``make cluster-up``),
    through its own paths: the trainer archive published to its object store, then each
    step submitted with ``zipline-dagster backfill --url`` to its webserver, which its
    daemon runs (waited for, with progress) -- nothing is materialized here."""
    import subprocess

    import dagster as dg

    from zipline_dagster.defs import defs
    from zipline_dagster.defs.listing_ctr import listing_ctr_model as model
    from zipline_dagster.defs.listing_ctr import listing_scores
    from zipline_dagster.scoring.monitoring import monitoring_asset_key
    from zipline_dagster.storage.resources import warehouse_of
    from zipline_dagster.storage.tables import days_between, shift_day
    from zipline_dagster.training.archive import publish_trainer_archive

    t0 = time.monotonic()
    print(f"[1/3] trainer archive from {TRAINER}", flush=True)
    published = publish_trainer_archive(
        TRAINER, model_name=model.name, base=model.model_artifact_base_uri
    )
    print(f"      version {published.version} at {published.uri}", flush=True)
    cli = str(Path(sys.executable).parent / "zipline-dagster")
    parts = [MODEL_START, MODEL_END]
    scored = [shift_day(MODEL_START, 1), shift_day(MODEL_END, 1)]
    # one backfill: the monitored days, their scores, the models that score them (day ds
    # by ds-1) and everything upstream, then the champion of the trained partitions
    target = monitoring_asset_key(listing_scores).to_user_string()
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
    store = warehouse_of(defs).store(model.model_artifact_base_uri)
    return 1 if summarize(instance, store, days_between(*parts), days_between(*scored)) else 0


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
