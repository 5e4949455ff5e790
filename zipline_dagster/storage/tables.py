"""Warehouse tables: Apache Iceberg tables partitioned by ``ds`` (identity), in one catalog.

The one module that reads and writes them (``Tables``). A day, or a range of days, is
replaced in one Iceberg commit: the new data files are staged, moved into the table's
``data/ds=...`` folder, and one transaction deletes the days and adds the files, so a
reader sees the old days or the new ones, never a mix, whatever dies in between. Each
snapshot's summary names the write (``zipline.write``), the Dagster run, the days and the
code version; a day's data version is the snapshot that last wrote it. A day computed
with no rows has no data file: the same transaction marks it in the table's properties
(``zipline.empty.{ds}``), so "computed, empty" differs from "never computed".

Everything else in the platform reads days through here (``Tables.days``): no folder is
listed to learn what a table holds. Other engines read the same tables through the
catalog with no platform code.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import re
import time
import uuid
import warnings
from collections.abc import Callable, Collection
from typing import Any

from zipline_dagster.storage.blobs import BlobStorageError, BlobStore
from zipline_dagster.storage.catalog import CatalogError, WarehouseError, reason
from zipline_dagster.storage.days import DAY, days_filter, format_days
from zipline_dagster.storage.paths import join_uri, table_uri
from zipline_dagster.storage.rows import day_arrow, schema_problems
from zipline_dagster.storage.table_days import (
    CODE_VERSION,
    DAYS,
    EMPTY,
    RUN,
    WRITE,
    TableDay,
    TableError,
    snapshot_summary,
    table_days,
)

#: Where a write's files land before their commit (``{table}/_staging/{write id}``).
STAGING_DIR = "_staging"
#: Optimistic commits that meet another writer's are retried this many times.
COMMIT_ATTEMPTS = 6
#: The materialization metadata naming the write that committed a table day: what the
#: ledger compares with the catalog's record of the day.
WRITE_ID = "write_id"
#: The materialization metadata naming a table day's Iceberg table (its identifier).
TABLE_NAME = "dagster/table_name"
SNAPSHOT_ID = "snapshot_id"
#: a platform write's data file: ``{write id}-{n}.parquet``
_WRITE_FILE = re.compile(r"^(.+)-\d{5}\.parquet$")


class SchemaMismatch(TableError):
    """A write's columns differ from its table's; names both. The days are left as they were."""


class DaysReplaced(TableError):
    """Another write replaced days of this one right after it committed them (the same
    days written at once): those days hold the other write's rows, so they are not this
    write's to record. ``committed``: the days still this write's; ``replaced``: {ds: the
    day as the other write left it}."""

    def __init__(
        self,
        table: str,
        committed: dict[str, TableDay],
        replaced: dict[str, TableDay | None],
        *,
        when: str = "right after this one committed it",
    ) -> None:
        self.committed, self.replaced = committed, replaced
        by = sorted({f"run {d.run_id or '?'} (write {d.write})" for d in replaced.values() if d})
        super().__init__(
            f"table {table}: {format_days(sorted(replaced))} was written by another write "
            f"({', '.join(by) or 'none held now'}) {when}; the day holds that write's rows, "
            "which its run records, not this one"
        )


def new_write_id() -> str:
    """Names one write's files: sortable by time, unique across writers."""
    return f"{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}"


class Tables:
    """The warehouse's tables in its catalog (``catalog``: a pyiceberg catalog, or what
    loads it on first use); ``store`` moves staged files and tidies."""

    def __init__(self, catalog: Callable[[], Any], warehouse: str, store: BlobStore) -> None:
        self._load_catalog, self._catalog = catalog, None
        self.warehouse, self.store = warehouse, store

    @property
    def catalog(self) -> Any:
        if self._catalog is None:
            self._catalog = self._load_catalog()
        return self._catalog

    def location(self, table: str) -> str:
        return table_uri(self.warehouse, table)

    def staging_uri(self, table: str, write_id: str) -> str:
        return join_uri(self.location(table), STAGING_DIR, write_id)

    def load(self, table: str) -> Any | None:
        """The Iceberg table ``ns.name``; None when the catalog has none."""
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

        try:
            return self.catalog.load_table(table)
        except (NoSuchTableError, NoSuchNamespaceError):
            return None
        except CatalogError:
            raise
        except Exception as exc:
            raise TableError(f"table {table}: the catalog cannot load it ({reason(exc)})") from exc

    def metadata_location(self, table: str) -> str | None:
        found = self.load(table)
        return None if found is None else str(found.metadata_location)

    def state(
        self, table: str, *, only: Collection[str] | None = None
    ) -> tuple[str | None, dict[str, TableDay]]:
        """The table's metadata file and committed days (of ``only``, when given), from one
        load (None, {} when the catalog has no such table)."""
        found = self.load(table)
        if found is None:
            return None, {}
        return str(found.metadata_location), table_days(table, found, only=only)

    def days(
        self,
        table: str,
        *,
        snapshot_id: int | None = None,
        only: Collection[str] | None = None,
    ) -> dict[str, TableDay]:
        """{ds: the day} for every committed day of ``table`` (of ``only``, when given: the
        manifests holding none of them are not read), at ``snapshot_id``, else its
        current snapshot; {} when the table does not exist."""
        found = self.load(table)
        if found is None:
            return {}
        return table_days(table, found, snapshot_id=snapshot_id, only=only)

    def commit(
        self,
        table: str,
        staged: dict[str, list[str]],
        *,
        write_id: str,
        run_id: str | None = None,
        code_version: str | None = None,
    ) -> dict[str, TableDay]:
        """Replace days ``staged`` ({ds: its staged parquet files; [] for a day with no
        rows}) in one commit; the days as committed.

        Raises:
            SchemaMismatch: a staged file's columns differ from the table's (nothing of
                this write is committed, and its files are removed).
            TableError: the files could not be moved in or the commit failed (named);
                the days are left as they were.
            DaysReplaced: another write of the same days committed right after this one:
                they hold its rows (named), the others are this write's.
        """
        existing = self.load(table)
        schema, moved = self._take_in(table, existing, staged, write_id)
        props = {WRITE: write_id, DAYS: ",".join(sorted(staged)), RUN: run_id or ""}
        props[CODE_VERSION] = code_version or ""
        try:
            self._commit_retrying(table, existing, schema, staged, moved, props)
        except WarehouseError:
            for uri in moved:  # never committed: nothing of this write stays
                _quietly(self.store.delete, uri)
            raise
        found = self.load(table)
        after = table_days(table, found, only=staged) if found is not None else {}
        self._tidy(table, staged, write_id, found, after)
        ours = {ds: after[ds] for ds in staged if ds in after and after[ds].write == write_id}
        if len(ours) < len(staged):  # the same day written at once: the later commit holds it
            raise DaysReplaced(table, ours, {ds: after.get(ds) for ds in staged if ds not in ours})
        return ours

    def _take_in(
        self, table: str, existing: Any | None, staged: dict[str, list[str]], write_id: str
    ) -> tuple[Any, list[str]]:
        """The staged files' schema (checked against the table's) and their URIs moved
        into the table's data folders."""
        files = [f for ds in sorted(staged) for f in staged[ds]]
        try:
            schema = self._check_schema(table, existing, files) if files else None
            if existing is None and schema is None:
                raise TableError(f"table {table}: a first write needs rows to give it its columns")
            return schema, self._move_in(table, staged, write_id)
        except FileNotFoundError as exc:  # what this write staged is gone
            raise self._staging_lost(table, staged) from exc

    def _staging_lost(self, table: str, staged: dict[str, list[str]]) -> DaysReplaced:
        """A write whose staged files went before its commit: a write of the same days
        committed while it ran, and tidied them as a killed writer's."""
        held = self.days(table, only=staged)
        return DaysReplaced(
            table, {}, {ds: held.get(ds) for ds in staged}, when="while this one ran, and "
            "removed what this one had staged (as a killed writer's)"
        )  # fmt: skip

    def _commit_retrying(
        self,
        table: str,
        existing: Any | None,
        schema: Any,
        staged: dict[str, list[str]],
        moved: list[str],
        props: dict[str, str],
    ) -> None:
        for attempt in range(COMMIT_ATTEMPTS):
            current = self.load(table) if attempt or existing is None else existing
            if current is None:
                current = self._create(table, schema)
            if self._try_commit(table, current, staged, moved, props):
                return
            time.sleep(0.05 * 2**attempt)
        else:
            raise TableError(
                f"table {table}: {COMMIT_ATTEMPTS} commits of {format_days(sorted(staged))} met "
                "other writers' commits; the days are left as they were"
            )

    def write_frame(
        self,
        table: str,
        ds: str,
        frame: Any,
        *,
        run_id: str | None = None,
        code_version: str | None = None,
    ) -> TableDay:
        """Replace day ``ds`` of ``table`` with a pandas frame or arrow table, in one commit
        (timestamps stored in microseconds, the finest unit Iceberg and Spark take)."""
        import io

        import pyarrow.parquet as pq

        write_id = new_write_id()
        arrow = day_arrow(frame, ds)
        staged: list[str] = []
        if arrow.num_rows:
            uri = join_uri(self.staging_uri(table, write_id), f"_{DAY}={ds}", "part-00000.parquet")
            sink = io.BytesIO()
            pq.write_table(arrow, sink)
            self.store.write_bytes(uri, sink.getvalue())
            staged.append(uri)
        elif self.load(table) is None:  # an empty first day still gives the table columns
            self._create(table, arrow.schema)
        return self.commit(
            table, {ds: staged}, write_id=write_id, run_id=run_id, code_version=code_version
        )[ds]

    # -- writing -------------------------------------------------------------------------

    def _create(self, table: str, schema: Any) -> Any:
        """Create ``table`` with the arrow ``schema``, partitioned by ``ds`` (identity)."""
        from pyiceberg.exceptions import TableAlreadyExistsError

        ns = table.split(".", 1)[0]
        try:
            self.catalog.create_namespace_if_not_exists(ns)
            tx = self.catalog.create_table_transaction(
                table, schema=schema, location=self.location(table)
            )
            with tx.update_spec() as spec:
                spec.add_identity(DAY)
            tx.commit_transaction()
            return self.catalog.load_table(table)
        except TableAlreadyExistsError:  # another writer made it first
            return self.catalog.load_table(table)
        except (CatalogError, TableError):
            raise
        except Exception as exc:
            raise TableError(f"table {table}: it cannot be created ({reason(exc)})") from exc

    def _check_schema(self, table: str, existing: Any | None, files: list[str]) -> Any:
        """The staged files' arrow schema, checked against the table's columns."""
        import io

        import pyarrow.parquet as pq

        try:
            if existing is not None:  # the footer only
                with existing.io.new_input(files[0]).open() as f:
                    schema = pq.read_schema(f)
            else:
                schema = pq.read_schema(io.BytesIO(self.store.read_bytes(files[0])))
        except FileNotFoundError:
            raise
        except (BlobStorageError, OSError) as exc:
            raise TableError(
                f"table {table}: the staged file {files[0]} cannot be read: {exc}"
            ) from exc
        if DAY not in schema.names:
            raise SchemaMismatch(f"table {table}: the staged files have no {DAY} column")
        if existing is not None:
            problems = schema_problems(existing.schema().as_arrow(), schema)
            if problems:
                for f in files:  # nothing of this write will be committed
                    _quietly(self.store.delete, f)
                raise SchemaMismatch(
                    f"table {table}: the new rows' columns do not match the table's "
                    f"({'; '.join(problems)}); the days are left as they were"
                )
        return schema

    def _move_in(self, table: str, staged: dict[str, list[str]], write_id: str) -> list[str]:
        moved: list[str] = []
        for ds in sorted(staged):
            for n, src in enumerate(staged[ds]):
                dst = join_uri(
                    self.location(table), "data", f"{DAY}={ds}", f"{write_id}-{n:05d}.parquet"
                )
                try:
                    self.store.move(src, dst)
                except (BlobStorageError, OSError) as exc:
                    for uri in moved:  # nothing of this write stays in the table's folder
                        _quietly(self.store.delete, uri)
                    if isinstance(exc, FileNotFoundError):
                        raise
                    raise TableError(
                        f"table {table}: moving {src} in failed ({exc}); "
                        f"{format_days(sorted(staged))} left as they were"
                    ) from exc
                moved.append(dst)
        return moved

    def _try_commit(
        self,
        table: str,
        current: Any,
        staged: dict[str, list[str]],
        moved: list[str],
        props: dict[str, str],
    ) -> bool:
        """One optimistic commit; False when another writer's commit came first."""
        from pyiceberg.exceptions import CommitFailedException

        from zipline_dagster.storage.iceberg_internals import transaction

        days = sorted(staged)
        empties = {f"{EMPTY}{ds}" for ds in days} & set(current.properties)
        try:
            with warnings.catch_warnings(), transaction(current) as tx:
                warnings.simplefilter("ignore")  # "Delete operation did not match any records"
                if current.current_snapshot() is not None:  # no snapshot when none matches
                    tx.delete(days_filter(days), snapshot_properties=props)
                if moved:
                    tx.add_files(moved, snapshot_properties=props, check_duplicate_files=False)
                if empties:
                    tx.remove_properties(*empties)
                marks = {f"{EMPTY}{ds}": json.dumps(props) for ds in days if not staged[ds]}
                if marks:
                    tx.set_properties(marks)
        except CommitFailedException:
            return False
        except (CatalogError, TableError):
            raise
        except Exception as exc:
            raise TableError(
                f"table {table}: committing {format_days(days)} failed ({reason(exc)}); "
                "the days are left as they were"
            ) from exc
        return True

    def _tidy(
        self,
        table: str,
        staged: dict[str, list[str]],
        write_id: str,
        found: Any | None,
        after: dict[str, TableDay],
    ) -> None:
        """After a commit, remove the staged files of the days committed (this write's,
        and those writers killed before their commit left), and the files of those days
        moved in that no snapshot names. Tidying never fails the write."""
        root = join_uri(self.location(table), STAGING_DIR)
        try:
            self._tidy_staging(root, {f"/_{DAY}={ds}/" for ds in staged})
            if found is not None:
                self._tidy_data(table, list(staged), found, after)
        except (BlobStorageError, OSError, TableError):
            return
        _remove_local_staging(root, write_id, list(staged))

    def _tidy_staging(self, root: str, days: set[str]) -> None:
        by_write: dict[str, list[str]] = {}
        for uri in self.store.list(root):
            by_write.setdefault(uri[len(root) :].strip("/").split("/", 1)[0], []).append(uri)
        for uris in by_write.values():
            # a range job stages its other days here too: only what holds no day still to
            # commit goes (Spark's _SUCCESS and checksums with the last day)
            pending = [u for u in uris if f"/_{DAY}=" in u and not any(d in u for d in days)]
            for uri in uris:
                if not pending or any(d in uri for d in days):
                    _quietly(self.store.delete, uri)

    def _tidy_data(
        self, table: str, days: list[str], found: Any, after: dict[str, TableDay]
    ) -> None:
        writes = {snapshot_summary(s).get(WRITE) for s in found.snapshots()}
        live = {f for d in after.values() for f in d.files}
        for ds in days:
            for uri in self.store.list(join_uri(self.location(table), "data", f"{DAY}={ds}")):
                name = _WRITE_FILE.match(uri.rsplit("/", 1)[-1])
                if name and name.group(1) not in writes and uri not in live:
                    _quietly(self.store.delete, uri)


def _quietly(fn: Callable[[str], None], uri: str) -> None:
    with contextlib.suppress(BlobStorageError, OSError):
        fn(uri)


def _remove_local_staging(root: str, write_id: str, days: list[str]) -> None:
    """On a local disk, also what a listing does not show: a killed writer's temp files
    in the staging folders of these days, and the folders left empty."""
    if not root.startswith("file://"):
        return
    import shutil

    from zipline_dagster.storage.blobs import local_path

    path = local_path(root)
    if not path.is_dir():
        return
    # at any depth (a killed Spark writer's _temporary/.../_ds=... too), in one walk
    names = {f"_{DAY}={ds}" for ds in days}
    for folder in [f for f in path.rglob(f"_{DAY}=*") if f.name in names]:
        shutil.rmtree(folder, ignore_errors=True)
    for folder in [path / write_id, *path.iterdir()]:
        if folder.is_dir() and not any(folder.rglob("*.parquet")):
            shutil.rmtree(folder, ignore_errors=True)
    with contextlib.suppress(OSError):
        path.rmdir()  # _staging itself, when no other write uses it
