"""Lineage: the shared partitions, the table registry and definitions factory, freshness
planning, backfills and the automation that retrains when inputs change."""
