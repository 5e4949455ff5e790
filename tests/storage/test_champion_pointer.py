"""The champion pointer typed (storage.champion_pointer.ChampionPointer): what
CHAMPION.json holds reads back as it was written, and a pointer written before a field
existed reads with its default."""

import json

from tests.support.training import make_model
from zipline_dagster.declarations.model import Model
from zipline_dagster.storage.blobs import blob_store
from zipline_dagster.storage.champion_pointer import (
    ChampionPointer,
    champion_uri,
    history,
    read_champion,
    write_pointer,
)


def _pointer(model: Model, ds: str, **kw: object) -> ChampionPointer:
    return ChampionPointer(model.name, model.version, ds, f"uri/{ds}", **kw)  # type: ignore[arg-type]


def test_a_pointer_reads_back_as_written_and_its_history_walks_back(file_base: str) -> None:
    model = make_model("a" * 12, file_base)
    store = blob_store(file_base)
    first = write_pointer(
        store, model, _pointer(model, "2026-07-10", metrics={"holdout_auc": 0.7}), None
    )
    assert first.replaced is None and first.moved_at is not None
    assert read_champion(store, model) == first
    second = write_pointer(
        store,
        model,
        _pointer(model, "2026-07-11", forced=True, checks_failed={"rollout_thresholds": "x"}),
        first,
    )
    held = read_champion(store, model)
    assert held == second and held.forced and held.replaced is not None
    (kept,) = history(store, model)
    assert kept.ds == "2026-07-10" and kept.history_name == second.replaced
    assert kept.metrics == {"holdout_auc": 0.7}
    # the file keeps the keys it always had; a history name only in the history
    raw = json.loads(store.read_bytes(champion_uri(model)))
    assert raw["ds"] == "2026-07-11" and "history_name" not in raw
    assert raw["checks_failed"] == {"rollout_thresholds": "x"}


def test_a_pointer_written_before_a_field_existed_reads_with_its_default() -> None:
    old = ChampionPointer.parse({"version": "b" * 12, "ds": "2026-07-10", "artifact_uri": "u"})
    assert (old.forced, old.gates_version, old.metrics, old.replaced) == (False, None, {}, None)
    assert old.where == f"{'b' * 12}/2026-07-10"
