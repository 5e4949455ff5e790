"""Test data: small training tables written exactly as producers write them; what the
loopback S3 server was asked (``s3_requests``); that server, or Azurite, behind a proxy
a test can break (``through_proxy``, ``s3_through_proxy``)."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import numpy as np
import pandas as pd

from zipline_dagster.storage.resources import WarehouseResource
from zipline_dagster.storage.tables import Tables


def faulty_trainer(dest: Path, *, fail_at_round: int) -> Path:
    """The reference classifier with its last Ray Train worker killed once at
    ``fail_at_round`` (``tests/fixtures/trainer_faults``): a copy of it at ``dest``, to
    train with ``python_module="trainer.faulty_train"``."""
    import shutil

    root = Path(__file__).resolve().parent
    shutil.copytree(
        root.parent / "trainers" / "listing_ctr_model",
        dest,
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    shutil.copytree(root / "fixtures" / "trainer_faults", dest, dirs_exist_ok=True)
    (dest / "trainer" / "fault.json").write_text(json.dumps({"fail_at_round": fail_at_round}))
    return dest


def days_ending(ds: str, n: int) -> list[str]:
    end = dt.date.fromisoformat(ds)
    return [(end - dt.timedelta(days=k)).isoformat() for k in range(n - 1, -1, -1)]


def ctr_rows(
    ds: str, rows: int, *, seed: int = 0, label: int | None = None, price_effect: float = -1.2
) -> pd.DataFrame:
    """Listing rows with a real click signal: cheaper (``price_effect`` < 0), well-stocked
    listings get clicked."""
    rng = np.random.default_rng([seed, int(ds.replace("-", ""))])
    price_log = rng.normal(4.0, 1.0, rows)
    inventory = rng.integers(0, 50, rows)
    logit = -1.0 + price_effect * (price_log - 4.0) + 0.04 * (inventory - 25)
    clicked = rng.random(rows) < 1 / (1 + np.exp(-logit))
    return pd.DataFrame(
        {
            "listing_id": np.arange(rows, dtype="int64"),
            "price_log": price_log,
            "inventory_count": inventory.astype("int64"),
            "label": (np.full(rows, label) if label is not None else clicked).astype("int64"),
        }
    )


def tables_of(warehouse: str, **resource: Any) -> Tables:
    """The tables of ``warehouse`` in its catalog (the embedded one unless ``resource`` says)."""
    return WarehouseResource(uri=warehouse, **resource).tables()


def write_partition(warehouse: str, table: str, ds: str, df: pd.DataFrame, **kw: Any) -> str:
    """Replace day ``ds`` of ``table`` with ``df`` (one Iceberg commit); the day's folder."""
    return tables_of(warehouse, **kw).write_frame(table, ds, df).uri


def write_table(warehouse: str, table: str, days: list[str], rows: int = 400, **kw: object) -> None:
    for ds in days:
        write_partition(warehouse, table, ds, ctr_rows(ds, rows, **kw))  # type: ignore[arg-type]


def partition_writes(warehouse: str, table: str) -> dict[str, str | None]:
    """{ds: the write (``write_id``) that committed it} for every committed day of the
    table, as its Iceberg snapshots say."""
    return {ds: d.write for ds, d in tables_of(warehouse).days(table).items()}


def local(uri: str) -> Path:
    from zipline_dagster.storage.blobs import local_path

    return local_path(uri)


@contextlib.contextmanager
def s3_requests(endpoint: str) -> Iterator[list[tuple[str, str]]]:
    """The requests the loopback S3 server gets inside the block, as (method, the object's
    name or "" for a bucket request), in order: counted by the server itself (moto's
    recorder), filled in when the block ends."""

    def recorder(action: str, method: str = "POST") -> str:
        req = urllib.request.Request(
            f"{endpoint}/moto-api/recorder/{action}",
            method=method,
            data=b"" if method == "POST" else None,
        )
        with urllib.request.urlopen(req, timeout=10) as response:
            return str(response.read().decode())

    seen: list[tuple[str, str]] = []
    recorder("reset-recording")
    recorder("start-recording")
    try:
        yield seen
    finally:
        recorder("stop-recording")
        for line in recorder("download-recording", "GET").splitlines():
            entry = json.loads(line)
            path = unquote(urlparse(entry["url"]).path).strip("/").split("/", 1)
            seen.append((entry["method"], path[1].rsplit("/", 1)[-1] if len(path) > 1 else ""))


#: Where the environment names each loopback object store, for ``through_proxy``.
PROXIED = {"s3": "AWS_ENDPOINT_URL", "abfss": "AZURE_STORAGE_CONNECTION_STRING"}


@contextlib.contextmanager
def through_proxy(scheme: str, latency: float = 0.0) -> Iterator[Any]:
    """The loopback server of ``scheme`` (``PROXIED``) the environment names, behind a
    ``TcpProxy`` (yielded): every client of that store made inside the block goes
    through it (a real socket a test can cut, stall, make refuse a kind of request or
    lose its answers, each request held ``latency`` seconds); the environment is
    restored after."""
    import pytest
    from adlfs import AzureBlobFileSystem
    from s3fs import S3FileSystem

    from tests.tcp_proxy import TcpProxy

    var = PROXIED[scheme]
    value = os.environ[var]
    found = re.search(r"http://([^:/;]+):(\d+)", value)
    assert found is not None, f"{var} names no http://host:port"
    host, port = found.groups()
    proxy = TcpProxy(host, int(port), latency=latency)
    caches = (S3FileSystem, AzureBlobFileSystem)  # fsspec keeps a client per settings
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(var, value.replace(f"{host}:{port}", f"127.0.0.1:{proxy.port}", 1))
        for fs in caches:
            fs.clear_instance_cache()
        try:
            yield proxy
        finally:
            proxy.close()
            for fs in caches:
                fs.clear_instance_cache()


@contextlib.contextmanager
def s3_through_proxy(latency: float = 0.0) -> Iterator[Any]:
    """``through_proxy`` for the loopback S3 server."""
    with through_proxy("s3", latency) as proxy:
        yield proxy


def run_days(job: Any, instance: Any, key: Any, first: str, last: str) -> Any:
    """One run of ``job`` materializing ``key``'s days ``first``..``last``, tagged as the
    UI and a backfill tag it (a range when there are several days); never raises on a
    failed step (the result says)."""
    from dagster._core.storage.tags import (
        ASSET_PARTITION_RANGE_END_TAG,
        ASSET_PARTITION_RANGE_START_TAG,
    )

    tags = (
        {"dagster/partition": first}
        if first == last
        else {ASSET_PARTITION_RANGE_START_TAG: first, ASSET_PARTITION_RANGE_END_TAG: last}
    )
    return job.execute_in_process(
        instance=instance, asset_selection=[key], tags=tags, raise_on_error=False
    )


def copy_run_as_failed(source: Any, target: Any, run_id: str, status: Any = None) -> None:
    """Run ``run_id`` of instance ``source`` known to ``target`` as a failed run (its record
    and snapshots, none of its events): what an instance holds of a run killed before it
    recorded anything (a kill cannot be timed between a promotion and its record). With
    ``status`` (a ``DagsterRunStatus``), as a run in that status: ``STARTED`` is a run
    still going that has not recorded its commit yet."""
    import dagster as dg

    run = source.get_run_by_id(run_id)
    assert run is not None and run.job_snapshot_id and run.execution_plan_snapshot_id
    target.add_snapshot(source.get_job_snapshot(run.job_snapshot_id))
    target.add_snapshot(source.get_execution_plan_snapshot(run.execution_plan_snapshot_id))
    target.add_run(run.with_status(status or dg.DagsterRunStatus.FAILURE))


def attempt_of(result: Any) -> str:
    """The attempt the one model materialization of ``result`` records."""
    (mat,) = [
        e.event_specific_data.materialization  # type: ignore[union-attr]
        for e in result.get_asset_materialization_events()
    ]
    return str(mat.metadata["attempt"].value)


def in_process_dagster_home(tmp_path: Path) -> Path:
    """A DAGSTER_HOME under ``tmp_path`` whose runs execute in the launching process, one
    after another (Dagster's in-memory launcher): a CLI backfill's logic is the same,
    without a process and a Spark JVM per run. Runs in their own processes (the default
    launcher) are what the UI test drives through `dagster dev`."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(
        "telemetry:\n  enabled: false\n"
        "run_launcher:\n"
        "  module: dagster._core.launcher.sync_in_memory_run_launcher\n"
        "  class: SyncInMemoryRunLauncher\n"
    )
    return home
