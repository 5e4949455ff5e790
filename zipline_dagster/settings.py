"""Embedded defaults, each overridable from the environment (see the deployment guide).

| setting | environment variable | embedded default |
| --- | --- | --- |
| local state (Ray head, warehouse) | ``ZIPLINE_HOME`` | ``./.zipline`` |
| warehouse root (tables) | ``ZIPLINE_WAREHOUSE`` | ``file://$ZIPLINE_HOME/warehouse`` |
| model artifacts base | ``ZIPLINE_ARTIFACT_BASE`` | same as the warehouse |
"""

from __future__ import annotations

import os
from pathlib import Path


def zipline_home() -> Path:
    return Path(os.environ.get("ZIPLINE_HOME") or Path.cwd() / ".zipline").resolve()


def warehouse_uri() -> str:
    return os.environ.get("ZIPLINE_WAREHOUSE") or (zipline_home() / "warehouse").as_uri()


def artifact_base_uri() -> str:
    return os.environ.get("ZIPLINE_ARTIFACT_BASE") or warehouse_uri()
