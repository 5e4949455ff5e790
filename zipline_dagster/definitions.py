"""The code location ``workspace.yaml`` loads. Importing it starts neither Ray nor Spark."""

from __future__ import annotations

import dagster as dg

defs = dg.Definitions()
