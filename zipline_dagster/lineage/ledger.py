"""The ledger: what storage holds committed, against what Dagster recorded, and the one
rule every consumer applies to the difference.

Storage is the truth. Every partition the platform writes is committed on storage (a
table or scores day by its marker, a model partition by its manifest: a
``storage.commits.Commit``, naming its write and the Dagster run that made it). Dagster
records a partition with the materialization its run logs once the commit is done. A
run stopped between the two (killed, its machine lost) leaves them apart. The rule:

* committed by a run that has ended without recording it (or a run this instance does
  not know): **recorded** into Dagster from storage, the materialization saying so, and a
  model partition's checks evaluated with it;
* committed by a run still going: **in flight**, left to that run;
* recorded, but no longer committed: **missing**.

The planner, training, scoring, monitoring, the champion and the ``promote`` CLI all
ask the ledger (``Ledger.settle``) and act on its ``Difference``; none compares on its
own.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import dagster as dg

from zipline_dagster.lineage.partitions import latest_materialization
from zipline_dagster.storage.commits import MODEL, Commit
from zipline_dagster.storage.tables import TABLE_NAME, WRITE_ID

#: The materialization metadata naming a model partition's attempt (its write).
ATTEMPT = "attempt"
#: The metadata entry of a materialization the ledger recorded from storage.
RECORDED_FROM_STORAGE = "zipline/recorded_from_storage"
CODE_VERSION_TAG = "dagster/code_version"
#: The model asset's metadata entry naming its version's folder of partitions
#: (``{base}/models/{name}/{version}``): where the planner finds a model partition storage
#: holds and Dagster never recorded.
ARTIFACT_ROOT = "zipline/artifact_root"

#: A model partition recorded from storage -> its checks' evaluations (the gates).
Judge = Callable[[dg.DagsterInstance, dg.AssetKey, str], Iterable[dg.AssetCheckEvaluation]]


class State(enum.StrEnum):
    """How a partition's commit on storage stands against Dagster's record of it."""

    #: the same write (or nothing on either side to compare)
    AGREE = "agree"
    #: committed by a run that ended without recording it: now recorded from storage
    RECORDED = "recorded from storage"
    #: committed by a run still going: left to that run
    IN_FLIGHT = "in flight"
    #: recorded, and no longer committed on storage
    MISSING = "missing"


@dataclass(frozen=True)
class Record:
    """Dagster's latest materialization of a partition, as far as the ledger reads it."""

    #: the write (or a model's attempt) it names; None: one naming none
    write: str | None
    run_id: str


@dataclass(frozen=True)
class Difference:
    """A partition's commit against Dagster's record, and what the rule made of it."""

    key: dg.AssetKey
    partition: str
    state: State
    commit: Commit | None
    record: Record | None
    #: the status of the run that made the commit, when the instance knows it
    run_status: str | None = None

    def describe(self) -> str:
        """One line for a message or the metadata: what storage held, what Dagster had."""
        c, r = self.commit, self.record
        what = "attempt" if c is not None and c.kind == MODEL else "write"
        held = f"{what} {c.write}" if c is not None else "nothing"
        by = (
            f"run {c.run_id}" + (f" ({self.run_status})" if self.run_status else "")
            if c is not None and c.run_id
            else "no Dagster run"
        )
        had = f"{what} {r.write} (run {r.run_id})" if r is not None else "no materialization"
        if self.state is State.RECORDED:
            return (
                f"storage holds {held}, committed by {by}, which ended without recording "
                f"it (Dagster had {had}): recorded from storage"
            )
        if self.state is State.IN_FLIGHT:
            return f"storage holds {held}, committed by {by}, which has not recorded it yet"
        if self.state is State.MISSING:
            return f"Dagster recorded {had}, but it is not committed on storage"
        return f"storage holds {held}, as Dagster recorded"


def prefixed(warn: Callable[[str], None], what: str) -> Callable[[str], None]:
    """``warn`` with ``what`` (the partition, as the step names it) before each text."""
    return lambda text: warn(f"{what}: {text}")


class Ledger:
    """Storage's commits against one Dagster instance's records (read once per partition
    per ledger), and the rule applied to their difference.

    Args:
        instance: the Dagster instance whose records are compared (and written to).
        judge: a model partition recorded from storage -> its checks' evaluations,
            reported with it (``rollout.assets.gate_judge``); None: none are.

    Example:
        ``Ledger(context.instance).settle(key, ds, commit)`` before a step uses a
        partition: the returned ``Difference``'s ``state`` says what storage and Dagster
        hold (``State.MISSING``: recorded and gone; ``State.IN_FLIGHT``: a run still
        going committed it).
    """

    def __init__(self, instance: dg.DagsterInstance, *, judge: Judge | None = None) -> None:
        self.instance = instance
        self.judge = judge
        self._records: dict[tuple[dg.AssetKey, str], Record | None] = {}
        #: what this ledger recorded into Dagster from storage, in order
        self.recorded: list[Difference] = []

    def record(self, key: dg.AssetKey, partition: str) -> Record | None:
        """Dagster's latest materialization of ``key`` partition ``partition``."""
        if (key, partition) not in self._records:
            self.remember(key, partition, latest_materialization(self.instance, key, partition))
        return self._records[(key, partition)]

    def remember(self, key: dg.AssetKey, partition: str, found: dg.EventLogRecord | None) -> None:
        """Take ``found``, the latest materialization of ``key`` partition ``partition``
        that the caller read (the planner reads a key's in one batch), as its record."""
        mat = found.asset_materialization if found is not None else None
        if found is None or mat is None:
            self._records[(key, partition)] = None
            return
        named = mat.metadata.get(WRITE_ID) or mat.metadata.get(ATTEMPT)
        write = str(named.value) if named is not None else None
        self._records[(key, partition)] = Record(write, found.run_id)

    def compare(self, key: dg.AssetKey, partition: str, commit: Commit | None) -> Difference:
        """The difference, without acting on it (an unrecorded commit is ``RECORDED`` only
        once ``settle`` records it: here it reads as ``RECORDED`` too, to be applied)."""
        record = self.record(key, partition)
        if commit is None:
            missing = record is not None and record.write is not None
            return Difference(
                key, partition, State.MISSING if missing else State.AGREE, None, record
            )
        if commit.write is None or (
            record is not None and (record.write is None or record.write == commit.write)
        ):
            return Difference(key, partition, State.AGREE, commit, record)
        run = self.instance.get_run_by_id(commit.run_id) if commit.run_id else None
        status = run.status.value if run is not None else None
        state = State.IN_FLIGHT if run is not None and not run.is_finished else State.RECORDED
        return Difference(key, partition, state, commit, record, status)

    def settle(self, key: dg.AssetKey, partition: str, commit: Commit | None) -> Difference:
        """``compare``, then the rule: a commit whose run ended without recording it is
        recorded into Dagster from storage (and, for a model partition, its checks
        evaluated with ``judge``)."""
        diff = self.compare(key, partition, commit)
        if diff.state is State.RECORDED and diff.commit is not None:
            self._record_from_storage(diff, diff.commit)
            self.recorded.append(diff)
        return diff

    def admit(
        self,
        key: dg.AssetKey,
        partition: str,
        commit: Commit | None,
        warn: Callable[[str], None],
    ) -> str | None:
        """The rule every step applies before it uses a partition (training its window,
        scoring by a model partition, monitoring a scores day, the champion judging one):
        ``settle``, ``warn`` told of a commit recorded into Dagster from storage now, and
        a commit by a run still going refused: why, returned (None: the partition may be
        used). Each caller raises its own error with the reason."""
        diff = self.settle(key, partition, commit)
        if diff.state is State.RECORDED:
            warn(diff.describe())
        return diff.describe() if diff.state is State.IN_FLIGHT else None

    def _record_from_storage(self, diff: Difference, commit: Commit) -> None:
        model = commit.kind == MODEL
        metadata = {
            RECORDED_FROM_STORAGE: dg.MetadataValue.text(diff.describe()),
            (ATTEMPT if model else WRITE_ID): dg.MetadataValue.text(str(commit.write)),
            ("artifact_uri" if model else "path"): dg.MetadataValue.path(commit.uri),
            "committed_by_run": dg.MetadataValue.text(commit.run_id or "none"),
        }
        if commit.table:  # a table day: the Iceberg table it is in
            metadata[TABLE_NAME] = dg.MetadataValue.text(commit.table)
        if model and commit.version:
            metadata["version"] = dg.MetadataValue.text(commit.version)
        tags = {CODE_VERSION_TAG: commit.code_version} if commit.code_version else None
        self.instance.report_runless_asset_event(
            dg.AssetMaterialization(
                asset_key=diff.key, partition=diff.partition, metadata=metadata, tags=tags
            )
        )
        self._records[(diff.key, diff.partition)] = Record(commit.write, "recorded from storage")
        if model and self.judge is not None:
            for evaluation in self.judge(self.instance, diff.key, diff.partition):
                self.instance.report_runless_asset_event(evaluation)
