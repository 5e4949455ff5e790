"""The fan-out trainer's data: a market table of many segments."""

from __future__ import annotations

import numpy as np
import pandas as pd

from tests.helpers import days_ending, write_partition
from tests.support.training import (
    DS,
    TABLE,
)


def market_rows(ds: str, segments: int, rows_per_segment: int) -> pd.DataFrame:
    rng = np.random.default_rng(int(ds.replace("-", "")))
    n = segments * rows_per_segment
    market = np.repeat([f"m{i:04d}" for i in range(segments)], rows_per_segment)
    price = rng.normal(0, 1, n)
    label = (rng.random(n) < 1 / (1 + np.exp(1.5 * price))).astype("int64")
    return pd.DataFrame(
        {"market": market, "price": price, "noise": rng.normal(0, 1, n), "label": label}
    )


def write_market_table(base: str, segments: int, rows_per_segment: int = 20) -> None:
    days = days_ending(DS, 4)
    for ds in days:
        frame = market_rows(ds, segments, rows_per_segment)
        if ds == days[-1]:  # a market that only exists on the holdout day cannot train
            bad = market_rows(ds, 1, rows_per_segment).assign(market="zz_new_market")
            frame = pd.concat([frame, bad], ignore_index=True)
        write_partition(base, TABLE, ds, frame)
