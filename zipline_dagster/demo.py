"""``make demo``: the main job end to end on embedded defaults."""

from __future__ import annotations

import sys
from pathlib import Path

from zipline_dagster.archive import publish_trainer_archive, verify_trainer_archive
from zipline_dagster.settings import artifact_base_uri

TRAINER = Path(__file__).resolve().parents[1] / "trainers" / "listing_ctr_model"


def main() -> int:
    base = artifact_base_uri()
    print(f"[1/2] building trainer archive from {TRAINER}", flush=True)
    published = publish_trainer_archive(TRAINER, model_name="listing_ctr_model", base=base)
    print(f"      version={published.version} uri={published.uri}", flush=True)
    print("[2/2] verifying the stored archive hashes to its version", flush=True)
    verify_trainer_archive(base=base, model_name="listing_ctr_model", version=published.version)
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
