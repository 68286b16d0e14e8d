"""How the learner scores a sample: at the sampling parameters it was drawn with (pure, no torch).

GRPO's ratio compares the policy's log-probs of a response with the log-probs the engine reported when it drew
it; both must be those of the same distribution, the logits divided by the temperature the call sampled at. So
each sample is scored at its own temperature, read from its LLM span's request parameters
(``gen_ai.request.temperature``, travelling with the triplet), not at one run-wide setting; a sample whose span
recorded none is scored at the temperature the trainer publishes (``LearnerConfig.temperature``).

Samples drawn from a distribution the learner cannot reproduce are **left out of the loss**, counted by reason
(``StepStats.left_out``) and named in the run's progress line; they still count in their group's mean and spread
(their reward is real), they only contribute no gradient:

* ``greedy``: temperature 0; an argmax has no sampling distribution to take a ratio against (and a group of
  greedy answers has no spread to learn from);
* ``top_p``: top_p below 1, and ``top_k``: top_k above 0; the engine sampled from a truncated distribution
  whose support depends on the policy's own logits;
* ``constrained``: decoded under a grammar (a forced tool call) whose text was not recorded with it. A forced
  call's span records its grammar (``litstream.grammar``); the learner then replays the grammar's masks over the
  response and scores each token under the masked, renormalised distribution it was drawn from, as the engines
  report it, so forced calls train: the choices the grammar left open (which tool, its arguments) get the gradient,
  the tokens it fixed get none.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from .samples import Sample

REASONS = ("greedy", "top_p", "top_k", "constrained")
WHAT_TO_TRY = {
    "greedy": "sample with a temperature above 0 (or name none: the policy's default applies)",
    "top_p": "leave top_p at 1 in the agent's calls",
    "top_k": "leave top_k unset in the agent's calls",
    "constrained": "serve the policy with litstream's endpoint, which records each forced call's grammar",
}


def temperature_of(sample: Sample, fallback: float) -> float:
    """The temperature ``sample`` was drawn at; ``fallback`` (the published one) when its span recorded none."""
    return sample.temperature if sample.temperature is not None else fallback


def why_left_out(sample: Sample, fallback_temperature: float) -> str | None:
    """One of ``REASONS`` when the learner cannot reproduce the distribution ``sample`` was drawn from."""
    if temperature_of(sample, fallback_temperature) <= 0:
        return "greedy"
    if sample.top_p is not None and sample.top_p < 1.0:
        return "top_p"
    if sample.top_k is not None and sample.top_k > 0:
        return "top_k"
    if sample.constrained and not sample.grammars:
        return "constrained"
    return None


def left_out_counts(samples: Iterable[Sample], fallback_temperature: float) -> Counter[str]:
    return Counter(r for r in (why_left_out(s, fallback_temperature) for s in samples) if r is not None)


def left_out_text(counts: dict[str, int], total: int) -> str | None:
    """One line for the progress output: how many samples were left out of the loss, why, and what to try."""
    n = sum(counts.values())
    if not n:
        return None
    why = ", ".join(f"{k} {v}" for k, v in counts.items())
    tries = "; ".join(WHAT_TO_TRY[k] for k in counts if k in WHAT_TO_TRY)
    return f"{n} of {total} samples left out of the loss, drawn in a way the learner cannot score ({why}): {tries}"
