"""Definitions built in a test."""

from __future__ import annotations

import dagster as dg

import zipline_dagster.defs.listing_ctr as demo
from zipline_dagster.definitions import build_definitions
from zipline_dagster.defs.resources import resources


def defs_with(model: object, **kw: object) -> dg.Definitions:
    return build_definitions(
        sources=[demo.listing_views],
        producers=[demo.listing_features, demo.ctr_labels, demo.training_table],
        models=[model],  # type: ignore[list-item]
        resources=resources(),
        **kw,  # type: ignore[arg-type]
    )
