"""The Dagster resource for where tables and artifacts live."""

from __future__ import annotations

import dagster as dg
from dagster_aws.s3 import S3Resource
from pydantic import Field

from zipline_dagster.settings import StorageOptions, settings
from zipline_dagster.storage import catalog
from zipline_dagster.storage.blobs import BlobStore, blob_store
from zipline_dagster.storage.tables import Tables


class WarehouseResource(dg.ConfigurableResource):
    """The warehouse: its tables' Iceberg catalog, their root, and how to reach object stores.

    Example:
        .. code-block:: python

            import dagster as dg
            from zipline_dagster.storage.resources import WarehouseResource

            defs = dg.Definitions(
                assets=[...],
                resources={
                    "warehouse": WarehouseResource(
                        uri="s3://bucket/warehouse",
                        catalog_name="prod",  # configured in .pyiceberg.yaml
                    )
                },
            )
    """

    uri: str = Field(
        description="Warehouse root: file:///... (embedded default), s3://bucket/prefix, "
        "gs://bucket/prefix or abfss://container@account.dfs.core.windows.net/prefix."
    )
    catalog_name: str = Field(
        default="zipline",
        description="The tables' pyiceberg catalog, as .pyiceberg.yaml / "
        "PYICEBERG_CATALOG__{NAME}__... configure it (REST, Glue, Hive, SQL).",
    )
    catalog_uri: str | None = Field(
        default=None,
        description="A SQL catalog's SQLAlchemy URL (sqlite:///..., postgresql+psycopg2://...); "
        "unset: pyiceberg's configuration of catalog_name. It may hold a password: give it "
        "as dg.EnvVar.",
    )
    s3: S3Resource = Field(
        default_factory=S3Resource,
        description="dagster-aws S3 settings (endpoint_url, region_name) for s3:// "
        "locations; credentials come from the standard AWS environment.",
    )
    gcs_endpoint_url: str | None = Field(
        default=None,
        description="GCS endpoint for gs:// locations (an emulator); default: Google Cloud "
        "Storage with the standard Google credentials.",
    )
    azure_connection_string: str | None = Field(
        default=None,
        description="Azure storage connection string for abfss:// locations (it holds the "
        "account key: give it as dg.EnvVar); default: the URI's account with Azure's "
        "default credential.",
    )

    def storage_options(self) -> StorageOptions:
        azure = self.azure_connection_string
        if isinstance(azure, dg.EnvVar):  # outside a run (at load): Dagster resolves it in runs
            azure = azure.get_value()
        return StorageOptions(
            s3_endpoint_url=self.s3.endpoint_url,
            aws_region=self.s3.region_name,
            gcs_endpoint_url=self.gcs_endpoint_url,
            azure_connection_string=azure,
        )

    def store(self, uri: str) -> BlobStore:
        return blob_store(uri, options=self.storage_options())

    def catalog_url(self) -> str | None:
        found = self.catalog_uri
        if isinstance(found, dg.EnvVar):  # outside a run (at load): Dagster resolves it in runs
            found = found.get_value()
        return found

    def tables(self) -> Tables:
        """The warehouse's tables, through its catalog (loaded on first use)."""
        options = self.storage_options()
        return Tables(
            lambda: catalog.load(self.catalog_name, self.catalog_url(), self.uri, options),
            self.uri,
            self.store(self.uri),
        )


def warehouse_of(defs: dg.Definitions) -> WarehouseResource:
    """The code location's warehouse: its ``warehouse`` resource, as its runs use it
    (so what the CLI and the planner read is what the runs wrote); the settings' when it
    has none."""
    found = (defs.resources or {}).get("warehouse")
    return found if isinstance(found, WarehouseResource) else default_warehouse()


def default_warehouse(*, for_definitions: bool = False) -> WarehouseResource:
    """The warehouse the settings describe (embedded default: a local folder).

    ``for_definitions``: the Azure connection string is given as
    ``dg.EnvVar("AZURE_STORAGE_CONNECTION_STRING")``, so Dagster resolves it in the run
    and shows only the variable's name, never its value.
    """
    env = settings()
    secret: str | None = env.azure_connection_string
    if secret and for_definitions:
        secret = dg.EnvVar("AZURE_STORAGE_CONNECTION_STRING")
    catalog_uri = env.catalog_uri
    if catalog_uri and for_definitions and catalog.has_password(catalog_uri):
        catalog_uri = dg.EnvVar("ZIPLINE_CATALOG_URI")
    return WarehouseResource(
        uri=env.warehouse,
        catalog_name=env.catalog,
        catalog_uri=catalog_uri,
        s3=S3Resource(endpoint_url=env.s3_endpoint_url, region_name=env.aws_region),
        gcs_endpoint_url=env.gcs_endpoint_url,
        azure_connection_string=secret,
    )
