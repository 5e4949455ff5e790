"""Turn a trainer's report into Dagster materialization metadata.

Each metric is a float (so the UI plots it across partitions); a metric the report could
not compute is left out and its ``status`` says why.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

import dagster as dg


def _range_text(split: dict[str, Any]) -> str:
    rng = split.get("date_range") or {}
    if not rng.get("start"):
        return "empty"
    return f"{rng['start']}..{rng['end']}"


def report_metadata(
    report: Mapping[str, Any], *, pr_curve_png: bytes | None = None
) -> dict[str, Any]:
    md: dict[str, Any] = {}
    for split in ("train", "holdout"):
        md.update(_split_metadata(split, report.get(split) or {}))
    status = report.get("status") or {}
    md["metric_status"] = dg.MetadataValue.json(status or {"all": "every metric computed"})
    for key, why in status.items():
        md[f"status/{key}"] = dg.MetadataValue.text(str(why))
    importance = report.get("feature_importance") or []
    if importance:
        md["feature_importance"] = _importance_table(importance)
    if pr_curve_png:
        b64 = base64.b64encode(pr_curve_png).decode()
        md["pr_curve"] = dg.MetadataValue.md(
            f"![precision-recall curve](data:image/png;base64,{b64})"
        )
    elif "pr_curve" in status:
        md["pr_curve"] = dg.MetadataValue.md(f"_no precision-recall curve: {status['pr_curve']}_")
    if "segments" in report:
        md.update(segment_metadata(report))
    md["report"] = dg.MetadataValue.json(report)
    return md


def _split_metadata(split: str, part: dict[str, Any]) -> dict[str, Any]:
    """A split's numeric metrics (floats, plotted by Dagster), rows and date range."""
    md: dict[str, Any] = {}
    for name, value in (part.get("metrics") or {}).items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            md[f"{split}/{name}"] = dg.MetadataValue.float(float(value))
    if "rows" in part:
        md[f"{split}/rows"] = dg.MetadataValue.int(int(part["rows"]))
    md[f"{split}/date_range"] = dg.MetadataValue.text(_range_text(part))
    return md


def _importance_table(importance: list[dict[str, Any]]) -> Any:
    return dg.MetadataValue.table(
        records=[
            dg.TableRecord(
                {
                    "feature": str(r.get("feature")),
                    "gain": float(r.get("gain", 0.0)),
                    "share": float(r.get("share", 0.0)),
                }
            )
            for r in importance
        ],
        schema=dg.TableSchema(
            columns=[
                dg.TableColumn("feature", "string"),
                dg.TableColumn("gain", "float"),
                dg.TableColumn("share", "float"),
            ]
        ),
    )


def segment_metadata(report: Mapping[str, Any]) -> dict[str, Any]:
    """A fan-out report: counts, a per-segment table, and every failed segment's error."""
    failed: dict[str, str] = report.get("segments_failed") or {}
    rows = [
        dg.TableRecord(
            {
                "segment": str(s["segment"]),
                "status": "trained",
                "train_rows": int(s.get("train_rows", 0)),
                "holdout_rows": int(s.get("holdout_rows", 0)),
                "holdout_auc": float(s["holdout_auc"]) if "holdout_auc" in s else None,
                "note": "; ".join(f"{k}: {v}" for k, v in (s.get("status") or {}).items()),
            }
        )
        for s in report["segments"]
    ]
    rows += [
        dg.TableRecord(
            {
                "segment": seg,
                "status": "failed",
                "train_rows": 0,
                "holdout_rows": 0,
                "holdout_auc": None,
                "note": err,
            }
        )
        for seg, err in sorted(failed.items())
    ]
    return {
        "segments/total": dg.MetadataValue.int(int(report.get("segments_total", len(rows)))),
        "segments/trained": dg.MetadataValue.int(
            int(report.get("segments_trained", len(report["segments"])))
        ),
        "segments/failed": dg.MetadataValue.int(len(failed)),
        "segments/failures": dg.MetadataValue.json(failed),
        "segments/summary": dg.MetadataValue.table(
            records=rows,
            schema=dg.TableSchema(
                columns=[
                    dg.TableColumn("segment", "string"),
                    dg.TableColumn("status", "string"),
                    dg.TableColumn("train_rows", "int"),
                    dg.TableColumn("holdout_rows", "int"),
                    dg.TableColumn("holdout_auc", "float"),
                    dg.TableColumn("note", "string"),
                ]
            ),
        ),
    }
