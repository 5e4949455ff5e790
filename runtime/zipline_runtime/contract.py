"""What the platform and a job both name, in one typed form each.

``PartitionRef``: one model partition (model, trainer version, day). It owns the
partition's folder (``{base}/models/{model}/{version}/{ds}``) and its display form
(``{version}/{ds}``, as messages, champion pointers and cards name it); nothing else
builds either, and nothing takes them apart again but ``PartitionRef.parse``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: A committed model partition's manifest, written last by the platform's promotion.
MANIFEST_NAME = "_MANIFEST.json"


class ContractError(ValueError):
    """A stored record does not hold what the contract says it does (names it)."""


def where(version: str, ds: str) -> str:
    """The display form of a partition (``PartitionRef.where``), for a record that holds
    a version and a day but not its model (a champion pointer's challenger)."""
    return f"{version}/{ds}"


@dataclass(frozen=True, order=True)
class PartitionRef:
    """A model partition: ``model``'s trainer ``version`` trained for ``day``."""

    model: str
    version: str
    day: dt.date

    @property
    def ds(self) -> str:
        """The day as Dagster's partition key (YYYY-MM-DD)."""
        return self.day.isoformat()

    @property
    def where(self) -> str:
        """``{version}/{ds}``: how messages, pointers and cards name it."""
        return where(self.version, self.ds)

    def uri(self, base: str) -> str:
        """``{base}/models/{model}/{version}/{ds}``: where its artifacts land."""
        return f"{base.rstrip('/')}/models/{self.model}/{self.version}/{self.ds}"

    @classmethod
    def of(cls, model: str, version: str, ds: str) -> PartitionRef:
        """The partition of ``model`` ``version`` on day ``ds`` (YYYY-MM-DD).

        Raises:
            ContractError: ``ds`` is not a day.
        """
        try:
            day = dt.date.fromisoformat(ds)
        except (TypeError, ValueError):
            raise ContractError(f"{ds!r} is not a day (YYYY-MM-DD)") from None
        return cls(model, version, day)

    @classmethod
    def parse(cls, model: str, where: str) -> PartitionRef:
        """The partition a stored display form (``{version}/{ds}``) names.

        Raises:
            ContractError: ``where`` is not of that form.
        """
        version, sep, ds = where.partition("/")
        if not sep or not version:
            raise ContractError(f"{where!r} names no partition; expected VERSION/YYYY-MM-DD")
        return cls.of(model, version, ds)

    @classmethod
    def of_manifest(cls, manifest: Mapping[str, Any], *, where: str) -> PartitionRef:
        """The partition a committed partition's manifest names (its ``model``,
        ``version`` and ``ds``, written by the platform when it promoted the attempt).

        Raises:
            ContractError: the manifest lacks one of them (names ``where``).
        """
        fields = [manifest.get(k) for k in ("model", "version", "ds")]
        if not all(isinstance(f, str) and f for f in fields):
            raise ContractError(
                f"{where} names no model, version and ds (found {fields}); a partition the "
                "platform committed always does"
            )
        return cls.of(*fields)  # type: ignore[arg-type]
