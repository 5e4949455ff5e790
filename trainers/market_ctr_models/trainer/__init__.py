"""Reference fan-out trainer: one small classifier per segment (e.g. per market)."""
