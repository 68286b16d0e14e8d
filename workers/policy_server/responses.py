"""Answers in OpenAI's shapes (whole responses and stream chunks) and the span attributes of a call (pure)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from litstream.schemas.events import AttrValue
from litstream.trainer.engines import Generation


@dataclass
class Call:
    """One answered call: what was asked, what the policy produced, and which version produced it."""

    kind: str  # "chat" | "text_completion"
    response_id: str
    created: int
    requested_model: str
    served_model: str
    prompt_token_ids: list[int]
    messages: list[tuple[str, str]]  # (role, text); a completion's prompt is one user message
    generations: list[Generation]
    version: int
    logprobs: bool = False
    token_ids: bool = False  # vLLM's return_token_ids

    @property
    def object(self) -> str:
        return "chat.completion" if self.kind == "chat" else "text_completion"

    def usage(self) -> dict[str, int]:
        completion = sum(len(g.token_ids) for g in self.generations)
        prompt = len(self.prompt_token_ids)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def head(self) -> dict[str, Any]:
        return {"id": self.response_id, "created": self.created, "model": self.served_model,
                "system_fingerprint": f"policy-v{self.version}"}


def token_text(decode: Any, token_id: int) -> str:
    return str(decode([token_id]))


def _chat_logprobs(gen: Generation, decode: Any) -> dict[str, Any]:
    content = []
    for tid, lp in zip(gen.token_ids, gen.logprobs):
        text = token_text(decode, tid)
        content.append({"token": text, "logprob": lp, "bytes": list(text.encode("utf-8")), "top_logprobs": []})
    return {"content": content}


def _completion_logprobs(gen: Generation, decode: Any) -> dict[str, Any]:
    tokens = [token_text(decode, t) for t in gen.token_ids]
    offsets, at = [], 0
    for t in tokens:
        offsets.append(at)
        at += len(t)
    return {"tokens": tokens, "token_logprobs": list(gen.logprobs), "top_logprobs": [{} for _ in tokens],
            "text_offset": offsets}


def full_response(call: Call, decode: Any) -> dict[str, Any]:
    choices = []
    for i, gen in enumerate(call.generations):
        if call.kind == "chat":
            choice: dict[str, Any] = {"index": i, "message": {"role": "assistant", "content": gen.text},
                                      "logprobs": _chat_logprobs(gen, decode) if call.logprobs else None,
                                      "finish_reason": gen.finish_reason}
        else:
            choice = {"index": i, "text": gen.text, "finish_reason": gen.finish_reason,
                      "logprobs": _completion_logprobs(gen, decode) if call.logprobs else None}
        if call.token_ids:
            choice["token_ids"] = list(gen.token_ids)
        choices.append(choice)
    body = {**call.head(), "object": call.object, "choices": choices, "usage": call.usage()}
    if call.token_ids:
        body["prompt_token_ids"] = list(call.prompt_token_ids)
    return body


def text_deltas(gen: Generation, decode: Any) -> list[str]:
    """The generation's text split token by token, so the pieces join to exactly ``gen.text``. A token that ends
    inside a multi-byte character adds nothing until the character is complete."""
    deltas, sent = [], 0
    for i in range(len(gen.token_ids)):
        prefix = str(decode(gen.token_ids[: i + 1]))
        stable = len(prefix) if not prefix.endswith("\ufffd") else sent
        stable = min(max(stable, sent), len(gen.text))
        deltas.append(gen.text[sent:stable])
        sent = stable
    if deltas:
        deltas[-1] += gen.text[sent:]
    elif gen.text:
        deltas.append(gen.text)
    return deltas


def stream_chunks(call: Call, decode: Any, include_usage: bool) -> Iterator[dict[str, Any]]:
    """The SSE chunks of a streamed answer: per choice, a role chunk (chat), one chunk per token, a finish chunk;
    then a usage chunk with no choices if asked (``stream_options.include_usage``)."""
    obj = "chat.completion.chunk" if call.kind == "chat" else "text_completion"
    head = {**call.head(), "object": obj}
    usage = {"usage": None} if include_usage else {}
    for i, gen in enumerate(call.generations):
        if call.kind == "chat":
            yield {**head, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                                        "logprobs": None, "finish_reason": None}], **usage}
        for j, piece in enumerate(text_deltas(gen, decode)):
            yield {**head, "choices": [_token_choice(call, gen, i, j, piece, decode)], **usage}
        last: dict[str, Any] = {"index": i, "finish_reason": gen.finish_reason, "logprobs": None}
        if call.kind == "chat":
            last["delta"] = {}
        else:
            last["text"] = ""
        yield {**head, "choices": [last], **usage}
    if include_usage:
        yield {**head, "choices": [], "usage": call.usage()}


def _token_choice(call: Call, gen: Generation, i: int, j: int, piece: str, decode: Any) -> dict[str, Any]:
    one = Generation(gen.prompt_token_ids, gen.token_ids[j: j + 1], gen.logprobs[j: j + 1], piece, gen.finish_reason)
    if call.kind == "chat":
        choice: dict[str, Any] = {"index": i, "delta": {"content": piece}, "finish_reason": None,
                                  "logprobs": _chat_logprobs(one, decode) if call.logprobs else None}
    else:
        choice = {"index": i, "text": piece, "finish_reason": None,
                  "logprobs": _completion_logprobs(one, decode) if call.logprobs else None}
    if call.token_ids:
        choice["token_ids"] = one.token_ids
    return choice


def span_attributes(call: Call, gen: Generation, index: int, sampling: dict[str, AttrValue],
                    path: str) -> dict[str, AttrValue]:
    """One choice's span: GenAI semantic conventions (flattened messages, usage) plus what training needs."""
    attrs: dict[str, AttrValue] = {
        "gen_ai.operation.name": call.kind, "gen_ai.system": "litstream",
        "gen_ai.request.model": call.requested_model, "gen_ai.response.model": call.served_model,
        "gen_ai.response.id": call.response_id if len(call.generations) == 1 else f"{call.response_id}.{index}",
        "gen_ai.response.finish_reasons": [gen.finish_reason],
        "gen_ai.usage.input_tokens": len(call.prompt_token_ids), "gen_ai.usage.output_tokens": len(gen.token_ids),
        "prompt_token_ids": list(call.prompt_token_ids), "response_token_ids": list(gen.token_ids),
        "response_logprobs": list(gen.logprobs), "litstream.policy.version": call.version,
        "litstream.choice.index": index, "http.route": path,
    }
    attrs.update({f"gen_ai.request.{k}": v for k, v in sampling.items() if v is not None})
    for n, (role, text) in enumerate(call.messages):
        attrs[f"gen_ai.prompt.{n}.role"] = role
        attrs[f"gen_ai.prompt.{n}.content"] = text
    attrs.update({"gen_ai.completion.0.role": "assistant", "gen_ai.completion.0.content": gen.text,
                  "gen_ai.completion.0.finish_reason": gen.finish_reason})
    return attrs


def sse(data: dict[str, Any] | str) -> bytes:
    import json

    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return f"data: {payload}\n\n".encode()


def models_list(names: Sequence[str], created: int, version: int,
                sampling_defaults: dict[str, Any] | None = None) -> dict[str, Any]:
    """``/v1/models``; ``litstream_sampling_defaults``: what a call that names no temperature, top_p or
    max_tokens samples with, and where that comes from."""
    extra = {"litstream_sampling_defaults": sampling_defaults} if sampling_defaults is not None else {}
    return {"object": "list", "data": [{"id": n, "object": "model", "created": created, "owned_by": "litstream",
                                        "litstream_policy_version": version, **extra} for n in names]}
