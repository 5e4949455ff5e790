"""A real MLflow tracking server for the tracking tests (``scripts/mlflow_server.py``:
``mlflow server`` from its own environment, SQLite store, local artifact root), started
once for the session in a temporary folder, recorded for cleanup and stopped after."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from scripts.mlflow_server import start
from tests.cleanup import register, unregister


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    server = start(tmp_path_factory.mktemp("mlflow"))
    register(server.identity.pid, group=True, what="MLflow tracking server")
    try:
        yield server
    finally:
        server.stop()
        unregister(server.identity.pid)
