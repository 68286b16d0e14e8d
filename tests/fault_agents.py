"""Agents for the fault tests (imported by runner subprocesses through PYTHONPATH)."""

from __future__ import annotations

import time
from typing import Any

from litstream.schemas.models import AttemptedRollout
from litstream.workers.sdk import AttemptContext


def stall_first_attempt(task: Any, rollout: AttemptedRollout, ctx: AttemptContext) -> float:
    """The first attempt hangs (its runner is killed meanwhile); a retry succeeds at once."""
    with ctx.span("work", {"attempt.sequence": rollout.attempt.sequence_id}):
        if rollout.attempt.sequence_id == 1:
            time.sleep(600)
    return 1.0
