"""The Dagster resource for where tables and artifacts live."""

from __future__ import annotations

import os
from typing import Any

import dagster as dg
from dagster_aws.s3 import S3Resource
from pydantic import Field

from zipline_dagster.settings import warehouse_uri
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
    return WarehouseResource(
        uri=warehouse_uri(),
        s3=S3Resource(
            endpoint_url=os.environ.get("AWS_ENDPOINT_URL_S3")
            or os.environ.get("AWS_ENDPOINT_URL"),
            region_name=os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION"),
        ),
    )
