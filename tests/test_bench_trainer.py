"""The trainer benchmark runs end to end at quick sizes (no Agent Lightning venv, no closed loop)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_bench_smoke import quick_bench


@pytest.mark.slow  # `make bench` runs it at full size
def test_trainer_benchmark_quick(tmp_path: Path) -> None:
    doc = json.loads(quick_bench("trainer", tmp_path).read_text())
    rows = {row["what"]: row for row in doc["rows"]}
    for what in ("spans -> triplets (litstream TracerTraceToTriplet)",
                 "triplets consumed: fetch, decode, window (no training)", "GRPO step (tiny, 8 groups x 4)",
                 "engine reload of a new version (TorchEngine)"):
        assert rows[what]["msgs_per_s"] > 0, what
    assert rows["spans -> triplets (Agent Lightning 0.3.0)"]["note"] == "--no-agl"
