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


LLM_CALL = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "toy", "prompt_token_ids": [11, 12, 13],
            "response_token_ids": [21, 22], "response_logprobs": [-0.5, -0.25], "gen_ai.prompt.0.role": "user",
            "gen_ai.prompt.0.content": "2+2?", "gen_ai.completion.0.role": "assistant",
            "gen_ai.completion.0.content": "4"}


def llm_call_agent(task: Any, ctx: AttemptContext) -> float:
    """One LLM call with token ids and a reward: each attempt makes one triplet."""
    with ctx.span("agent.rollout"), ctx.span("chat toy", dict(LLM_CALL)):
        pass
    return 1.0


def llm_call_or_stall_first(task: Any, rollout: AttemptedRollout, ctx: AttemptContext) -> float:
    """Tasks with ``stall`` hang 10 s in their first attempt (in flight when the stack stops, which the test does
    as soon as it sees them running; not longer, as a stopping runner's process waits for its agents' threads); a
    retry, and every other task, makes one LLM call with token ids (one triplet) and succeeds."""
    with ctx.span("agent.rollout", {"attempt.sequence": rollout.attempt.sequence_id}):
        if isinstance(task, dict) and task.get("stall") and rollout.attempt.sequence_id == 1:
            time.sleep(10)
        with ctx.span("chat toy", dict(LLM_CALL)):
            pass
    return 1.0
