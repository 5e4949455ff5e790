"""The demo code location: loads without Ray or Spark, pins its trainer, reads its settings."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import TRAINERS
from zipline_dagster.archive import build_trainer_archive


def test_pinned_version_is_the_reference_trainer_build() -> None:
    from zipline_dagster.definitions import LISTING_CTR_MODEL_VERSION

    built = build_trainer_archive(TRAINERS / "listing_ctr_model").version
    assert built == LISTING_CTR_MODEL_VERSION, (
        f"trainers/listing_ctr_model builds {built}; update LISTING_CTR_MODEL_VERSION in definitions.py"
    )


def test_code_location_loads_without_ray_or_spark() -> None:
    code = (
        "import sys, zipline_dagster.definitions as d; d.defs.resolve_asset_graph(); "
        "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'pyspark'))))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == ""


def test_settings_come_from_the_environment_without_contacting_anything() -> None:
    code = """
import json
from zipline_dagster.definitions import defs, listing_ctr_model
r = defs.resources
print(json.dumps({
    "ray": r["launcher"].address, "spark": r["spark"].config()["spark.master"],
    "warehouse": r["warehouse"].uri, "s3": r["warehouse"].s3.endpoint_url,
    "base": listing_ctr_model.model_artifact_base_uri,
}))
"""
    env = {
        "PATH": "/usr/bin:/bin",
        "RAY_ADDRESS": "http://raycluster-head-svc.ml:8265",
        "SPARK_MASTER": "spark://spark-master:7077",
        "ZIPLINE_WAREHOUSE": "s3://acme-warehouse/tables",
        "ZIPLINE_ARTIFACT_BASE": "s3://acme-ml/artifacts",
        "AWS_ENDPOINT_URL": "https://minio.internal:9000",
    }
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert res.returncode == 0, res.stderr
    import json

    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got == {
        "ray": "http://raycluster-head-svc.ml:8265",
        "spark": "spark://spark-master:7077",
        "warehouse": "s3://acme-warehouse/tables",
        "s3": "https://minio.internal:9000",
        "base": "s3://acme-ml/artifacts",
    }
