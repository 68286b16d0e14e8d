"""A training sample: one response (or one attempt's joined turns) with what the learner needs to score it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class GrammarSpan:
    start: int
    end: int
    lark: str


@dataclass(frozen=True)
class Sample:
    rollout_id: str
    attempt_id: str
    index: int
    group_id: str
    policy_version: int | None
    prompt_token_ids: Sequence[int]
    response_token_ids: Sequence[int]
    response_logprobs: Sequence[float]  # from the generating engine: the old log-probs of GRPO
    reward: float
    # How the response was drawn, as its LLM span recorded the request (None: not recorded). The learner scores
    # each sample at its own temperature (trainer/sampling.py).
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    constrained: bool = False  # decoded under a grammar (a forced tool call), in whole or in part
    # Where it was: the response tokens [start, end) decoded under the grammar with this Lark text, as the span
    # recorded it. The learner replays each grammar's masks and scores those tokens under them, as they were drawn;
    # a constrained sample whose grammar was not recorded is left out of the loss (trainer/sampling.py).
    grammars: tuple[GrammarSpan, ...] = ()
    # Trajectory mode (trainer/trajectories.py): 1 where a response token was sampled (it takes part in the loss),
    # 0 where it was not (tool results, template glue between turns); None: every response token was sampled.
    loss_mask: tuple[int, ...] | None = None
    turns: int = 1  # the attempt's LLM calls this sample holds

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.rollout_id, self.attempt_id, self.index)
