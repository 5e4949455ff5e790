"""MLflow for one step (``Tracker``, made by ``MlflowResource.tracker``, in ``listener``): each call
bounded, a run per model partition attempt, the registry's versions and the
``champion`` alias following the platform's pointer. See the package's docstring."""

from __future__ import annotations

import os
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar

from zipline_dagster.storage.artifacts import report_metrics
from zipline_dagster.storage.blobs import BlobStore, blob_store
from zipline_dagster.storage.paths import join_uri
from zipline_dagster.tracking.records import (
    ATTEMPT_TAG,
    CHAMPION_ALIAS,
    GATES_TAG,
    IDENTITY_TAG,
    MAX_TAG,
    PENDING_TAG,
    REMOTE_SCHEMES,
    Logged,
    Partition,
    Synced,
    flag_params,
    shown_uri,
)

T = TypeVar("T")


class TrackerConf(Protocol):
    """Where and how a tracker logs: ``MlflowResource``'s fields."""

    tracking_uri: str | None
    experiment: str
    timeout_s: float
    step_budget_s: float
    copy_artifacts: bool
    dagster_url: str | None


class Tracker:
    """MLflow for one step: each call bounded by ``timeout_s``; after one that failed,
    the rest of the step skips MLflow (said once)."""

    def __init__(
        self,
        conf: TrackerConf,
        warn: Callable[[str], None],
        store: Callable[[str], BlobStore] = blob_store,
    ) -> None:
        assert conf.tracking_uri
        self.conf, self.warn, self.store = conf, warn, store
        self.uri = conf.tracking_uri
        self.down: str | None = None
        self._client: Any = None
        #: seconds this step has waited on MLflow
        self.spent = 0.0
        #: when the MLflow call under way began (``_Watched``); None: none is
        self._calling: float | None = None
        self._experiments: dict[str, str] = {}

    # -- bounded calls ------------------------------------------------------------------

    def _bounded(self, what: str, fn: Callable[[], T]) -> T | None:
        """``fn()`` in a daemon thread, watched: None (warned) when one of its MLflow calls
        has not answered in ``timeout_s``, or MLflow has taken ``step_budget_s`` of this
        step in all, or it raised, or MLflow failed earlier in this step."""
        if self.down is not None:
            return None
        self.client()  # importing mlflow (2 s) is not the server's wait
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["value"] = fn()
            except BaseException as exc:  # reported below, never raised into the step
                box["error"] = exc

        thread = threading.Thread(target=run, name=f"mlflow: {what}", daemon=True)
        began = time.monotonic()
        thread.start()
        while thread.is_alive():
            thread.join(0.05)
            started, now = self._calling, time.monotonic()
            if started is not None and now - started > self.conf.timeout_s:
                self.down = f"no answer within {self.conf.timeout_s:g}s"
            elif self.spent + now - began > self.conf.step_budget_s:
                self.down = f"it has taken {self.conf.step_budget_s:g}s of this step"
            if self.down is not None:
                break
        self.spent += time.monotonic() - began
        if self.down is None:
            if "error" not in box:
                return box.get("value")
            exc = box["error"]
            text = str(exc).splitlines()[0][:300] if str(exc) else ""
            self.down = f"{type(exc).__name__}: {shown_uri(text)}"
        self.warn(
            f"MLflow at {shown_uri(self.uri)} skipped ({what}): {self.down}. Nothing else "
            "waits on it in this step; the champion's next evaluation logs what it missed"
        )
        return None

    def client(self) -> Any:
        if self._client is None:
            # one try per request, which ends soon after the watch gave up on it: MLflow's
            # defaults retry 7 times over minutes (set unless the deployment set its own)
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
            # a run's link is in Dagster's metadata, not printed to the step's stdout
            os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(int(self.conf.timeout_s) + 5))
            from mlflow.tracking import MlflowClient

            self._client = _Watched(
                MlflowClient(tracking_uri=self.uri, registry_uri=self.uri), self
            )
        return self._client

    # -- runs -----------------------------------------------------------------------------

    def log(self, p: Partition) -> Logged | None:
        """The MLflow run of ``p``'s attempt, logged now unless it already was (gates,
        when given, set as tags either way); None when MLflow was skipped."""
        return self._bounded(f"log {p.model} {p.ds}", lambda: self._log(p))

    def experiment_id(self, model: str) -> str:
        from mlflow.exceptions import MlflowException

        name = self.conf.experiment.format(model=model)
        if name not in self._experiments:
            client = self.client()
            found = client.get_experiment_by_name(name)
            if found is None:
                try:
                    exp_id = client.create_experiment(name, tags={"zipline.model": model})
                except MlflowException:  # created by another process meanwhile
                    exp_id = client.get_experiment_by_name(name).experiment_id
            else:
                exp_id = found.experiment_id
            self._experiments[name] = exp_id
        return self._experiments[name]

    def runs(self, model: str, key: str | None = None) -> list[Any]:
        """The complete runs of ``model`` (of one partition attempt), earliest first."""
        where = f"attributes.status = 'FINISHED' and tags.`{IDENTITY_TAG}` " + (
            f"= '{key}'" if key is not None else "!= ''"
        )
        found = self.client().search_runs(
            [self.experiment_id(model)],
            filter_string=where,
            max_results=50000 if key is None else 100,
            order_by=["attributes.start_time ASC"],
        )
        return sorted(found, key=lambda r: (r.info.start_time, r.info.run_id))

    def _delete_extras(self, model: str, runs: list[Any]) -> list[Any]:
        """Delete any complete run of an attempt after its earliest (``runs``: the complete
        ones, earliest first) and the runs left incomplete for an attempt that has a
        complete one; the runs kept."""
        client = self.client()
        kept: dict[str | None, Any] = {}
        for run in runs:
            key = run.data.tags.get(IDENTITY_TAG)
            if key in kept:
                client.delete_run(run.info.run_id)
            else:
                kept[key] = run
        logged = set(kept)
        for run in client.search_runs(
            [self.experiment_id(model)],
            filter_string=f"tags.`{PENDING_TAG}` != ''",
            max_results=50000,
        ):
            complete = run.info.status == "FINISHED" and IDENTITY_TAG in run.data.tags
            if not complete and run.data.tags.get(PENDING_TAG) in logged:
                client.delete_run(run.info.run_id)
        return list(kept.values())

    def run_url(self, model: str, run_id: str) -> str:
        return f"{shown_uri(self.uri).rstrip('/')}/#/experiments/{self.experiment_id(model)}/runs/{run_id}"

    def _log(self, p: Partition) -> Logged:
        from mlflow.entities import Metric, Param, RunTag

        client = self.client()
        existing = self.runs(p.model, p.key)
        if existing:
            run_id = existing[0].info.run_id
        else:
            tags = {
                ATTEMPT_TAG: p.attempt,
                PENDING_TAG: p.key,
                "zipline.asset_key": p.asset_key,
                "zipline.partition": p.ds,
                "zipline.version": p.version,
                "zipline.artifact_uri": p.artifact_uri,
                "zipline.dagster_run_id": p.dagster_run_id or "none",
                "mlflow.note.content": (
                    f"Dagster asset {p.asset_key} partition {p.ds}, attempt {p.attempt}"
                ),
            }
            if p.dagster_run_id and self.conf.dagster_url:
                tags["zipline.dagster_run_url"] = (
                    f"{self.conf.dagster_url.rstrip('/')}/runs/{p.dagster_run_id}"
                )
            run = client.create_run(
                self.experiment_id(p.model), run_name=f"{p.model} {p.ds}", tags=tags
            )
            run_id = run.info.run_id
            client.log_batch(
                run_id,
                metrics=[
                    Metric(k, v, 0, 0)
                    for k, v in report_metrics(dict(p.report)).items()
                    if v is not None
                ],
                params=[Param(k, v) for k, v in flag_params(p.flags).items()],
                tags=[RunTag("zipline.files", str(len(p.files)))],
            )
            client.log_dict(run_id, dict(p.report), "report/metrics.json")
            self._log_model(client, run_id, p)
            client.set_terminated(run_id, "FINISHED")
            client.set_tag(run_id, IDENTITY_TAG, p.key)  # complete
            # two processes logging one attempt at once: the earliest run stays
            runs = self.runs(p.model, p.key)
            keep = runs[0].info.run_id if runs else run_id
            if keep != run_id:
                client.delete_run(run_id)
                run_id = keep
        if p.gates is not None:
            self._tag_gates(client, run_id, p.gates)
        return Logged(run_id, self.run_url(p.model, run_id))

    def _log_model(self, client: Any, run_id: str, p: Partition) -> None:
        reference = {"artifact_uri": p.artifact_uri, "files": list(p.files)}
        client.log_dict(run_id, reference, "model/zipline_reference.json")
        if not self.conf.copy_artifacts:
            return
        store = self.store(p.artifact_uri)
        with tempfile.TemporaryDirectory(prefix="zipline-mlflow-") as tmp:
            for rel in p.files:
                dest = Path(tmp, rel)
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(store.read_bytes(join_uri(p.artifact_uri, rel)))
            client.log_artifacts(run_id, tmp, "model")

    @staticmethod
    def _tag_gates(client: Any, run_id: str, gates: Mapping[str, tuple[bool, str]]) -> None:
        from mlflow.entities import RunTag

        failed = sorted(n for n, (ok, _) in gates.items() if not ok)
        tags = [RunTag(GATES_TAG, "failed: " + ", ".join(failed) if failed else "passed")]
        tags += [
            RunTag(f"zipline.gate.{n}", ("passed: " if ok else "failed: ") + why[:MAX_TAG])
            for n, (ok, why) in sorted(gates.items())
        ]
        client.log_batch(run_id, tags=tags)

    # -- the registry ------------------------------------------------------------------------

    def sync(
        self,
        model: str,
        trained: Mapping[str, str],
        load: Callable[[str], Partition | None],
        champion: Partition | None,
        *,
        moved: bool,
        earlier: Callable[[set[tuple[str, str]]], list[Partition]] = lambda known: [],
    ) -> Synced | None:
        """Log each trained partition (``trained``: day -> its committed attempt) whose
        attempt has no run yet, as ``load`` gives it; register a model version for each
        earlier champion without one (``earlier``: those whose (version, ds) is not in the
        set it is given); then put the alias ``champion`` on the model version of
        ``champion``'s attempt (registered now if it has none). ``moved``: our pointer
        moved in this step, so an alias elsewhere is just behind; otherwise it was moved
        in MLflow, and is put back with a warning. None when MLflow was skipped."""

        def sync() -> Synced:
            runs = self._delete_extras(model, self.runs(model))
            logged = {r.data.tags.get(IDENTITY_TAG) for r in runs}
            # a run whose gates step never tagged it (failed, or MLflow down by then)
            unjudged = {r.data.tags.get(IDENTITY_TAG) for r in runs if GATES_TAG not in r.data.tags}
            caught_up = []
            for ds, attempt in sorted(trained.items()):
                key = f"{ds}/{attempt}"
                if (key not in logged or key in unjudged) and (p := load(ds)) is not None:
                    self._log(p)
                    caught_up.append(ds)
            if champion is None:
                return Synced(caught_up)
            versions = self._versions(model)
            known = {
                (v.tags.get("zipline.version"), v.tags.get("zipline.partition")) for v in versions
            }
            registered = []
            for p in earlier(known):  # champions moved past while MLflow was not reachable
                if p.key != champion.key:
                    self._version(model, p, self._log(p), versions)
                    registered.append(f"{p.version}/{p.ds}")
            run = self._log(champion)
            return self._alias(model, champion, run, moved, versions, caught_up, registered)

        return self._bounded(f"sync {model}", sync)

    def summary(self, model: str) -> list[str] | None:
        """What MLflow holds of ``model``: its runs (partitions), its registered model and
        the version the alias ``champion`` is on; None when MLflow was skipped."""

        def read() -> list[str]:
            from mlflow.exceptions import MlflowException

            runs = self.runs(model)
            days = sorted({r.data.tags.get("zipline.partition", "?") for r in runs})
            base = shown_uri(self.uri).rstrip("/")
            lines = [
                f"{len(runs)} runs in experiment {self.conf.experiment.format(model=model)!r} "
                f"(partitions {', '.join(days) or 'none'}): "
                f"{base}/#/experiments/{self.experiment_id(model)}"
            ]
            try:
                v = self.client().get_model_version_by_alias(model, CHAMPION_ALIAS)
            except MlflowException:
                return [*lines, f"registered model {model}: no @{CHAMPION_ALIAS} alias"]
            return [
                *lines,
                f"models:/{model}@{CHAMPION_ALIAS} = version {v.version} (partition "
                f"{v.tags.get('zipline.partition', '?')}): {base}/#/models/{model}",
            ]

        return self._bounded(f"read {model}", read)

    def _versions(self, name: str) -> list[Any]:
        """The versions of the registered model ``name`` (registered now if it is not)."""
        from mlflow.exceptions import MlflowException

        client = self.client()
        try:
            client.create_registered_model(name, tags={"zipline.model": name})
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
        return list(client.search_model_versions(f"name = '{name}'"))

    def _version(self, name: str, p: Partition, run: Logged, versions: list[Any]) -> Any:
        """The model version of ``p``'s attempt (its earliest), created now if it has none
        (and added to ``versions``)."""
        mine = [v for v in versions if v.tags.get(IDENTITY_TAG) == p.key]
        if mine:
            return min(mine, key=lambda v: int(v.version))
        remote = urllib.parse.urlsplit(p.artifact_uri).scheme in REMOTE_SCHEMES
        source = (
            p.artifact_uri
            if remote and not self.conf.copy_artifacts
            else f"runs:/{run.run_id}/model"
        )
        version = self.client().create_model_version(
            name,
            source,
            run_id=run.run_id,
            tags={
                ATTEMPT_TAG: p.attempt,
                IDENTITY_TAG: p.key,
                "zipline.partition": p.ds,
                "zipline.version": p.version,
                "zipline.artifact_uri": p.artifact_uri,
            },
            description=f"{name} partition {p.ds} (trainer version {p.version})",
            await_creation_for=0,
        )
        versions.append(version)
        return version

    def _alias(
        self,
        name: str,
        p: Partition,
        run: Logged,
        moved: bool,
        versions: list[Any],
        caught_up: list[str],
        registered: list[str],
    ) -> Synced:
        from mlflow.exceptions import MlflowException

        client = self.client()
        version = self._version(name, p, run, versions)
        try:
            current = client.get_model_version_by_alias(name, CHAMPION_ALIAS)
        except MlflowException:
            current = None
        put_back = None
        if current is None or current.version != version.version:
            client.set_registered_model_alias(name, CHAMPION_ALIAS, version.version)
            if current is not None and not moved:
                put_back = (
                    f"MLflow's alias {name}@{CHAMPION_ALIAS} was on version {current.version} "
                    f"(partition {current.tags.get('zipline.partition', '?')}), not on the "
                    f"champion {p.version}/{p.ds}: put back on version {version.version}"
                )
        url = f"{shown_uri(self.uri).rstrip('/')}/#/models/{name}/versions/{version.version}"
        return Synced(caught_up, str(version.version), url, put_back, registered)


class _Watched:
    """An MlflowClient whose calls tell the tracker when each began and ended, so that
    the wait is bounded per call, not per whole operation (a sync makes many)."""

    def __init__(self, client: Any, tracker: Tracker) -> None:
        self._client, self._tracker = client, tracker

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            if self._tracker.down is not None:
                # the step gave up on this thread's work: it makes no further call (a
                # held request answered later must not go on to complete a run)
                raise RuntimeError(f"MLflow skipped in this step: {self._tracker.down}")
            self._tracker._calling = time.monotonic()
            try:
                return attr(*args, **kwargs)
            finally:
                self._tracker._calling = None

        return call
