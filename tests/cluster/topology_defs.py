"""The code location the topology tests deploy (``tests/cluster/test_topology.py``): one
model on an external table, trained by the slow fixture trainer, so that a fault can
land while a training runs. The test publishes the archive and writes the table, then
names them here through ``ZIPLINE_TOPOLOGY`` (JSON: the trainer version, the artifact
base and how many half-second steps a training takes). Loaded by the cluster's daemon and
webserver (its workspace file), like ``zipline_dagster.defs``."""

from __future__ import annotations

import json
import os

from tests.support.training import TABLE, make_model
from zipline_dagster.definitions import ExternalTable, build_definitions
from zipline_dagster.defs.resources import resources

MODEL = "topology_model"

_conf = json.loads(os.environ["ZIPLINE_TOPOLOGY"])
model = make_model(
    _conf["version"], _conf["base"], name=MODEL, job_configs={"steps": str(_conf["steps"])}
)
defs = build_definitions(
    external_tables=[ExternalTable(TABLE)],
    models=[model],
    resources=resources(),
    automation=False,  # only the tests' backfills launch runs
)
