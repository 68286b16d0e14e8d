"""The trainer benchmark runs end to end at quick sizes (no Agent Lightning venv, no closed loop)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow  # `make bench` runs it at full size
def test_trainer_benchmark_quick(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "litstream.bench", "--only", "trainer", "--quick", "--no-agl",
         "--results-dir", str(tmp_path)],
        check=False, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(next(tmp_path.glob("trainer-*.json")).read_text())
    rows = {row["what"]: row for row in doc["rows"]}
    for what in ("spans -> triplets (litstream TracerTraceToTriplet)",
                 "triplets consumed: fetch, decode, window (no training)", "GRPO step (tiny, 8 groups x 4)",
                 "engine reload of a new version (TorchEngine)"):
        assert rows[what]["msgs_per_s"] > 0, what
    assert rows["spans -> triplets (Agent Lightning 0.3.0)"]["note"] == "--no-agl"
