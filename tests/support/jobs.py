"""Job requests in a test."""

from __future__ import annotations

from zipline_dagster.storage.artifacts import (
    attempt_dir,
)


def _attempt(store: object, d: str, attempt: str, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        store.write_bytes(f"{attempt_dir(d, attempt)}/{name}", data)  # type: ignore[attr-defined]
