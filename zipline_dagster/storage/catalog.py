"""The pyiceberg catalog that holds every warehouse table.

Configured the way pyiceberg configures catalogs: a catalog named ``ZIPLINE_CATALOG``
(default ``zipline``) in ``.pyiceberg.yaml`` or ``PYICEBERG_CATALOG__ZIPLINE__...`` (a
REST catalog such as Polaris or Nessie, Glue, Hive, SQL) is loaded as pyiceberg loads it.
A SQL catalog at ``ZIPLINE_CATALOG_URI`` (a SQLAlchemy URL: the topology's PostgreSQL
database) comes first. Without either, the embedded default: SQLite, one catalog per
warehouse (``catalog.db`` in a ``file://`` warehouse's folder; for an object-store
warehouse, ``$ZIPLINE_HOME/catalogs/{hash of its URI}.db``).
The platform adds only how to reach the object stores (its ``StorageOptions``).
"""

from __future__ import annotations

from typing import Any

from zipline_dagster.settings import StorageOptions

#: The FileIO the platform's catalogs use: fsspec's filesystems, which the platform's
#: blob store (``storage.blobs``) configures the same way.
FSSPEC_IO = "pyiceberg.io.fsspec.FsspecFileIO"


class WarehouseError(RuntimeError):
    """A warehouse table or its catalog cannot be read or written; the message says which."""


class CatalogError(WarehouseError):
    """The catalog cannot be loaded or reached; names the catalog, never a password."""


def configured(name: str) -> bool:
    """Whether pyiceberg's own configuration (``.pyiceberg.yaml``, ``PYICEBERG_CATALOG__``)
    names catalog ``name``."""
    from pyiceberg.utils.config import Config

    return bool(Config().get_catalog_config(name))


def shown_uri(uri: str) -> str:
    """A SQLAlchemy URL with its password masked (for messages and the UI)."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(uri).render_as_string(hide_password=True)
    except Exception:  # not a URL SQLAlchemy parses: show its scheme only
        return uri.split("://", 1)[0] + "://..."


def has_password(uri: str) -> bool:
    try:
        from sqlalchemy.engine import make_url

        return make_url(uri).password is not None
    except Exception:
        return False


def io_properties(options: StorageOptions) -> dict[str, str]:
    """pyiceberg FileIO properties for the platform's storage options."""
    props = {"py-io-impl": FSSPEC_IO}
    if options.s3_endpoint_url:
        props["s3.endpoint"] = options.s3_endpoint_url
    if options.aws_region:
        props["s3.region"] = options.aws_region
    if options.gcs_endpoint_url:
        props["gcs.service.host"] = options.gcs_endpoint_url
    if options.azure_connection_string:
        props["adls.connection-string"] = options.azure_connection_string
    return props


def load(name: str, uri: str | None, warehouse: str, options: StorageOptions) -> Any:
    """Catalog ``name``: a SQL catalog at ``uri`` when given; else pyiceberg's
    configuration of ``name``.

    Raises:
        CatalogError: neither says what the catalog is, or it cannot be reached; the
            message names the catalog (its URL with the password masked).
    """
    from pyiceberg.catalog import load_catalog

    props: dict[str, str] = {**io_properties(options), "warehouse": warehouse}
    if uri is None and not configured(name):
        uri = embedded_uri(warehouse)
    if uri is not None:
        props.update(type="sql", uri=uri)
        where = f"SQL catalog {name!r} at {shown_uri(uri)}"
    else:
        where = f"catalog {name!r} (from pyiceberg's configuration)"
    try:
        catalog = load_catalog(name, **props)
        catalog.list_namespaces()  # reach it now, so a wrong address fails here, named
    except Exception as exc:  # pyiceberg and SQLAlchemy raise many types
        raise CatalogError(f"{where} cannot be reached: {reason(exc, uri)}") from None
    return catalog


def embedded_uri(warehouse: str) -> str:
    """The embedded SQLite catalog of ``warehouse``."""
    import hashlib
    from pathlib import Path

    from zipline_dagster.settings import settings
    from zipline_dagster.storage.blobs import local_path

    if warehouse.startswith("file://"):
        path = local_path(warehouse) / "catalog.db"
    else:
        digest = hashlib.sha256(warehouse.encode()).hexdigest()[:16]
        path = settings().home / "catalogs" / f"{digest}.db"
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


def reason(exc: BaseException, uri: str | None = None) -> str:
    """The first line of ``exc``, with ``uri``'s password masked out of it."""
    text = (str(exc).strip().splitlines() or [""])[0]
    if uri:
        from sqlalchemy.engine import make_url

        try:
            password = make_url(uri).password
        except Exception:
            password = None
        if password:
            text = text.replace(str(password), "***")
    return f"{type(exc).__name__}: {text[:300]}"
