"""The closed loop's agent: asks the trained policy (its LLM resource) to do the toy task, scores the answer.

Its LLM span follows the OpenTelemetry GenAI conventions and carries what training needs: the prompt's and the
response's token ids and the generating engine's log-probs of the response tokens (GRPO's old log-probs). The
reward span follows it, so the triplet processor matches the reward to this call.
"""

from __future__ import annotations

import uuid
from typing import Any

from litstream.schemas.models import LLM
from litstream.trainer import toy_task

from .policy_engines import POLICIES
from .sdk import AttemptContext


def toy_policy_agent(task: dict[str, Any], llm: LLM | None, ctx: AttemptContext) -> None:
    if llm is None:
        raise RuntimeError("no LLM resource published yet: start the trainer (it publishes policy-v0) first")
    tok = POLICIES.tokenizer(llm)
    prompt = toy_task.render_prompt(task)
    prompt_ids = tok.encode(prompt)
    sampling = {"temperature": 1.0, "max_tokens": toy_task.MAX_NEW_TOKENS, **llm.sampling_parameters}
    with ctx.span(f"chat {llm.model}", {
        "gen_ai.operation.name": "chat", "gen_ai.system": "litstream", "gen_ai.request.model": llm.model,
        "gen_ai.request.temperature": float(sampling["temperature"]),
        "gen_ai.request.max_tokens": int(sampling["max_tokens"]),
        "gen_ai.prompt.0.role": "user", "gen_ai.prompt.0.content": prompt, "prompt_token_ids": prompt_ids,
    }) as span:
        gens, version = POLICIES.generate(llm, [prompt_ids], **sampling)
        gen = gens[0]
        span.set_attributes({
            "gen_ai.response.id": f"gen-{uuid.uuid4().hex}", "gen_ai.response.model": f"{llm.model}",
            "gen_ai.response.finish_reasons": [gen.finish_reason],
            "gen_ai.completion.0.role": "assistant", "gen_ai.completion.0.content": gen.text,
            "gen_ai.usage.input_tokens": len(prompt_ids), "gen_ai.usage.output_tokens": len(gen.token_ids),
            "response_token_ids": gen.token_ids, "response_logprobs": gen.logprobs,
            "litstream.policy.version": version,
        })
    ctx.emit_reward(toy_task.reward(task, gen.text))
