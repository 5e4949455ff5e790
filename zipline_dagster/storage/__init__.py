"""Storage: URIs and the paths derived from a model definition, blobs (file://, s3://),
and warehouse tables with atomic partitions."""
