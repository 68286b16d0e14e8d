"""One sequence per attempt: the turns of a multi-turn agent joined into one training sample (no torch).

Per-call triplets (Agent Lightning 0.3's semantics) train each LLM call of an attempt on its own, so every later
call's prompt repeats the conversation so far. In trajectory mode, as verl's agent loop, SkyRL and Agent Lightning
1.0 train, an attempt becomes one sequence: the first call's prompt, then every turn's response tokens with what
came between them (tool results, the next user turn, the chat template's glue). Only the tokens the model sampled
take part in the loss; the others are masked out. A turn decoded under a grammar (a forced tool call) keeps its
grammar's span in the joined response, so the learner scores it under the grammar's masks; one whose grammar was not
recorded is masked out too.

A join needs each turn's prompt to start with exactly the previous turn's prompt and response tokens, as recorded.
A template that re-renders the history differently (another split of the same text, a dropped reasoning block),
turns drawn at different temperatures, or a missing turn leave the attempt as per-call samples, and
``JoinStats`` counts why.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from .samples import GrammarSpan, Sample


@dataclass
class JoinStats:
    joined: int = 0  # attempts trained as one sequence
    single: int = 0  # attempts of one call (nothing to join)
    fallbacks: dict[str, int] = field(default_factory=dict)  # attempts left as per-call samples, by reason

    def count(self, reason: str) -> None:
        self.fallbacks[reason] = self.fallbacks.get(reason, 0) + 1


def join_turns(turns: Sequence[Sample]) -> Sample | str:
    """The attempt's turns (all of them, any order) as one sample, or why they cannot be joined. The sample's
    reward is the attempt's final reward (the last reward among its turns; a turn without a reward of its own holds
    NaN), its version the oldest turn's (for staleness)."""
    turns = sorted(turns, key=lambda s: s.index)
    if [t.index for t in turns] != list(range(len(turns))):
        return "missing turn"
    first = turns[0]
    drawn = {(t.temperature, t.top_p, t.top_k) for t in turns if not t.constrained or t.grammars}  # the scored ones
    if len(drawn) > 1:
        return "turns drawn differently"
    sequence = list(first.prompt_token_ids)
    response: list[int] = []
    logprobs: list[float] = []
    mask: list[int] = []
    grammars: list[GrammarSpan] = []
    for t in turns:
        prompt = list(t.prompt_token_ids)
        if prompt[: len(sequence)] != sequence:
            return "prompt does not extend the previous turn"
        glue = prompt[len(sequence):]
        if t is not first:
            response += glue
            logprobs += [0.0] * len(glue)
            mask += [0] * len(glue)
        grammars += [GrammarSpan(g.start + len(response), g.end + len(response), g.lark) for g in t.grammars]
        response += t.response_token_ids
        logprobs += t.response_logprobs
        mask += [0 if t.constrained and not t.grammars else 1] * len(t.response_token_ids)
        sequence = prompt + list(t.response_token_ids)
    if not any(mask):
        return "no sampled token"
    rewarded = [t for t in turns if math.isfinite(t.reward)]
    if not rewarded:
        return "no reward"
    versions = [t.policy_version for t in turns if t.policy_version is not None]
    last = turns[-1]
    (temperature, top_p, top_k), = drawn or {(last.temperature, last.top_p, last.top_k)}
    return replace(first, response_token_ids=tuple(response), response_logprobs=tuple(logprobs),
                   loss_mask=tuple(mask), reward=rewarded[-1].reward, policy_version=min(versions) if versions else None,
                   temperature=temperature, top_p=top_p, top_k=top_k, constrained=bool(grammars),
                   grammars=tuple(grammars), turns=len(turns))


def join_attempt(turns: Sequence[Sample], stats: JoinStats) -> list[Sample]:
    """One joined sample, or the turns as they are (per-call samples) with the reason counted."""
    if len(turns) == 1:
        stats.single += 1
        return list(turns)
    joined = join_turns(turns)
    if isinstance(joined, str):
        stats.count(joined)
        return sorted(turns, key=lambda s: s.index)
    stats.joined += 1
    return [joined]
