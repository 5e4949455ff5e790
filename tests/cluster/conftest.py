"""One production topology (``scripts/cluster.py``) for the whole package: Postgres, S3, a
Ray head with two worker nodes, and Dagster's daemon and webserver (Spark left out: no
test here runs a Spark step), serving the
code location ``tests.cluster.topology_defs``. Its services are recorded for the test
run's cleanup and stopped by ``Cluster.down`` (by PID, nothing else on the machine)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.topology import LAST_DAY, STEPS, Topology
from tests.conftest import FIXTURE_TRAINERS, ROOT
from tests.helpers import ctr_rows, days_ending, tables_of
from tests.support.training import TABLE


@pytest.fixture(scope="package")
def topology(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Topology]:
    from scripts.cluster import SERVICES, Cluster
    from zipline_dagster.jobs.archive import publish_trainer_archive

    if not sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres")):
        pytest.fail("no PostgreSQL server: `make test` installs it (scripts/system-deps)")
    # under the project, not /tmp/pytest-of-*: Postgres runs as its own user and must
    # reach its data folder
    folder = ROOT / ".zipline" / f"test-cluster-{os.getpid()}"
    base = (tmp_path_factory.mktemp("topology") / "artifacts").as_uri()
    version = publish_trainer_archive(
        FIXTURE_TRAINERS / "slow_trainer", model_name="topology_model", base=base
    ).version
    workspace = folder.parent / f"{folder.name}-workspace.yaml"
    folder.parent.mkdir(parents=True, exist_ok=True)
    workspace.write_text(
        "load_from:\n  - python_module:\n      module_name: tests.cluster.topology_defs\n"
        f"      working_directory: {ROOT}\n"
    )
    saved = dict(os.environ)
    os.environ.update(
        {
            "ZIPLINE_CLUSTER_DIR": str(folder),
            "ZIPLINE_CLUSTER_WORKSPACE": str(workspace),
            "ZIPLINE_TOPOLOGY": json.dumps({"version": version, "base": base, "steps": STEPS}),
        }
    )
    cluster = Cluster(folder)
    try:
        # every service but Spark's: no test here runs a Spark step (the code location
        # trains on an external table), and its two idle JVMs cost some 20 CPU-s a run;
        # `make cluster-up` starts them with the rest
        cluster.up(only=[s for s in SERVICES if not s.startswith("spark-")])
        os.environ.update(cluster.env())  # this process is a client of the deployment
        env = cluster.env()
        # into the deployment's catalog (its PostgreSQL database), as its runs read it
        tables = tables_of(env["ZIPLINE_WAREHOUSE"], catalog_uri=env["ZIPLINE_CATALOG_URI"])
        for ds in days_ending(LAST_DAY, 16):
            tables.write_frame(TABLE, ds, ctr_rows(ds, 50))
        topology = Topology(cluster)
        yield topology
        # what the tests' waits (as the CLI's) concluded, the daemon concluded too
        topology.assert_daemon_agreed()
    finally:
        cluster.down()
        os.environ.clear()
        os.environ.update(saved)
        shutil.rmtree(folder, ignore_errors=True)
        workspace.unlink(missing_ok=True)
