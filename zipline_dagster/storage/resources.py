"""The Dagster resource for where tables and artifacts live."""

from __future__ import annotations

from typing import Any

import dagster as dg
from dagster_aws.s3 import S3Resource
from pydantic import Field

from zipline_dagster.settings import settings
from zipline_dagster.storage.blobs import BlobStore, blob_store


class WarehouseResource(dg.ConfigurableResource):
    """The warehouse root (tables) and the client for ``s3://`` locations."""

    uri: str = Field(
        description="Warehouse root: file:///... (embedded default) or s3://bucket/prefix."
    )
    s3: S3Resource = Field(
        default_factory=S3Resource,
        description="dagster-aws S3 client settings (endpoint_url, region_name ...); credentials "
        "come from the standard AWS environment.",
    )

    def s3_client_for(self, uri: str) -> Any:
        """The configured S3 client for ``s3://`` URIs, None for anything else."""
        return self.s3.get_client() if uri.startswith("s3://") else None

    def store(self, uri: str) -> BlobStore:
        return blob_store(uri, s3_client=self.s3_client_for(uri))


def default_warehouse() -> WarehouseResource:
    """The warehouse the settings describe (embedded default: a local folder)."""
    env = settings()
    return WarehouseResource(
        uri=env.warehouse,
        s3=S3Resource(
            endpoint_url=env.s3_endpoint_url,
            region_name=env.aws_region,
        ),
    )
