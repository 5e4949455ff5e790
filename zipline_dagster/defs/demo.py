"""``make demo``: the listing-CTR pipeline end to end on embedded defaults.

Builds and uploads the trainer archive, then materializes, upstream first, every
missing or stale partition the model range needs (synthetic events, features and labels
on local Spark, the training table, and one Ray Job per model partition on the embedded
Ray head), and prints each trained partition's artifact path and holdout AUC. A second
run finds everything fresh and does nothing.
"""

import json
import os
import sys
import time
from pathlib import Path

MODEL_START = os.environ.get("ZIPLINE_DEMO_START", "2026-07-11")
MODEL_END = os.environ.get("ZIPLINE_DEMO_END", "2026-07-14")
TRAINER = Path(__file__).resolve().parents[2] / "trainers" / "listing_ctr_model"


def main() -> int:
    import dagster as dg

    from zipline_dagster.defs import defs
    from zipline_dagster.defs.listing_ctr import listing_ctr_model
    from zipline_dagster.lineage.backfill import (
        execute_plan_in_process,
        model_partitions,
        plan_backfill,
    )
    from zipline_dagster.storage.blobs import blob_store
    from zipline_dagster.storage.paths import MANIFEST_NAME, join_uri, model_partition_uri
    from zipline_dagster.training.archive import publish_trainer_archive
    from zipline_dagster.training.request import is_committed

    t0 = time.monotonic()
    model = listing_ctr_model
    print(f"[1/3] trainer archive from {TRAINER}", flush=True)
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
    key = dg.AssetKey(["models", model.name])
    parts = model_partitions(defs, key, MODEL_START, MODEL_END)
    plan = plan_backfill(defs, instance, key, parts)
    print(
        f"[2/3] plan for {key.to_user_string()} {MODEL_START}..{MODEL_END}:\n{plan.describe()}",
        flush=True,
    )
    execute_plan_in_process(defs, instance, plan, log=lambda m: print(f"      {m}", flush=True))

    print(f"[3/3] trained partitions ({time.monotonic() - t0:.0f}s):", flush=True)
    unfinished = []
    for ds in parts:
        model_dir = model_partition_uri(model, ds)
        store = blob_store(model_dir)
        # Trained means a manifest on storage whose every checksum matches, whatever
        # Dagster recorded.
        if not is_committed(store, model_dir):
            print(f"      {ds}  NOT FINISHED: no complete {MANIFEST_NAME} in {model_dir}")
            unfinished.append(ds)
            continue
        report = json.loads(store.read_bytes(join_uri(model_dir, "metrics.json")))
        auc = report["holdout"]["metrics"]["auc"]
        auc_text = f"{auc:.3f}" if auc is not None else report["status"].get("holdout.auc", "n/a")
        print(
            f"      {ds}  holdout AUC {auc_text}  rows {report['train']['rows']}+{report['holdout']['rows']}  {model_dir}"
        )
    if unfinished:
        print(f"error: {len(unfinished)} partitions have no finished model", file=sys.stderr)
        return 1
    print(
        "open the Dagster UI with `make dev` (http://127.0.0.1:3000); stop the embedded Ray head with `make ray-down`"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
