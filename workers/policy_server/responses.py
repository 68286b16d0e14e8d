"""Answers in OpenAI's shapes (whole responses and stream chunks) and the span attributes of a call (pure)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from litstream.schemas.events import AttrValue
from litstream.trainer.constrained import tool_call_lark
from litstream.trainer.engines import Generation

from .tool_calls import Parsed, ToolAnswer


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
    tools: ToolAnswer | None = None  # a chat call with tools offered or calls in its history

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

    def parsed(self, index: int) -> Parsed | None:
        """The generation's calls, when it made any."""
        parsed = self.tools.of(index) if self.tools is not None else None
        return parsed if parsed is not None and parsed.calls else None

    def finish_reason(self, index: int) -> str:
        return "tool_calls" if self.parsed(index) is not None else self.generations[index].finish_reason

    def content(self, index: int) -> str | None:
        """The answer's text: all of it, or the text outside its calls (None when there is none)."""
        parsed = self.parsed(index)
        return parsed.content if parsed is not None else self.generations[index].text


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
            choice: dict[str, Any] = {"index": i, "message": _message(call, i),
                                      "logprobs": _chat_logprobs(gen, decode) if call.logprobs else None,
                                      "finish_reason": call.finish_reason(i)}
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


def _message(call: Call, index: int) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": call.content(index)}
    parsed = call.parsed(index)
    if parsed is not None:
        message["tool_calls"] = [c.openai() for c in parsed.calls]
    return message


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
        parsed = call.parsed(i)
        if parsed is not None:
            yield from ({**head, "choices": [choice], **usage} for choice in _tool_chunks(call, gen, i, parsed, decode))
            continue
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


def _tool_chunks(call: Call, gen: Generation, i: int, parsed: Parsed, decode: Any) -> Iterator[dict[str, Any]]:
    """A choice with calls, streamed as OpenAI and vLLM do: the role, the text outside the calls, then each call
    (its id, type and name with empty arguments, then its arguments), then the finish. Every sampled token's
    log-prob and id rides on the chunk that carries its text (the text before the first call: on the content
    chunk, or on the first call's when there is no content), so the chunks together hold all of them."""
    groups = _token_groups(gen, decode, parsed.spans)
    yield _delta(call, gen, i, {"role": "assistant", "content": None}, [], decode)
    before = groups[0]
    if parsed.content is not None:
        yield _delta(call, gen, i, {"content": parsed.content}, before, decode)
        before = []
    for k, tc in enumerate(parsed.calls):
        head = {"index": k, "id": tc.id, "type": "function", "function": {"name": tc.name, "arguments": ""}}
        yield _delta(call, gen, i, {"tool_calls": [head]}, [], decode)
        arguments = {"index": k, "function": {"arguments": tc.arguments}}
        yield _delta(call, gen, i, {"tool_calls": [arguments]}, before + groups[k + 1], decode)
        before = []
    last = _delta(call, gen, i, {}, groups[-1], decode)
    last["finish_reason"] = "tool_calls"
    yield last


def _token_groups(gen: Generation, decode: Any, spans: Sequence[tuple[int, int]]) -> list[list[int]]:
    """The generation's token indices by where their text lies: before the first call, in each call (a token
    that spans a call's start belongs to the call), after the last."""
    groups: list[list[int]] = [[] for _ in range(len(spans) + 2)]
    at = 0
    for j, piece in enumerate(text_deltas(gen, decode)):
        end = at + len(piece)
        if spans and end <= spans[0][0] and (piece or at < spans[0][0]):
            groups[0].append(j)
        else:
            k = next((n for n, (_, stop) in enumerate(spans) if at < stop), len(spans))
            groups[k + 1].append(j)
        at = end
    return groups


def _delta(call: Call, gen: Generation, i: int, delta: dict[str, Any], tokens: list[int],
           decode: Any) -> dict[str, Any]:
    ids = [gen.token_ids[j] for j in tokens]
    some = Generation(gen.prompt_token_ids, ids, [gen.logprobs[j] for j in tokens], "", gen.finish_reason)
    choice: dict[str, Any] = {"index": i, "delta": delta, "finish_reason": None,
                              "logprobs": _chat_logprobs(some, decode) if call.logprobs and ids else None}
    if call.token_ids:
        choice["token_ids"] = ids
    return choice


def span_attributes(call: Call, gen: Generation, index: int, sampling: dict[str, AttrValue],
                    path: str) -> dict[str, AttrValue]:
    """One choice's span: GenAI semantic conventions (flattened messages, usage) plus what training needs."""
    attrs: dict[str, AttrValue] = {
        "gen_ai.operation.name": call.kind, "gen_ai.system": "litstream",
        "gen_ai.request.model": call.requested_model, "gen_ai.response.model": call.served_model,
        "gen_ai.response.id": call.response_id if len(call.generations) == 1 else f"{call.response_id}.{index}",
        "gen_ai.response.finish_reasons": [call.finish_reason(index)],
        "gen_ai.usage.input_tokens": len(call.prompt_token_ids), "gen_ai.usage.output_tokens": len(gen.token_ids),
        "prompt_token_ids": list(call.prompt_token_ids), "response_token_ids": list(gen.token_ids),
        "response_logprobs": list(gen.logprobs), "litstream.policy.version": call.version,
        "litstream.choice.index": index, "http.route": path,
    }
    attrs.update({f"gen_ai.request.{k}": v for k, v in sampling.items() if v is not None})
    for n, (role, text) in enumerate(call.messages):
        attrs[f"gen_ai.prompt.{n}.role"] = role
        attrs[f"gen_ai.prompt.{n}.content"] = text
    attrs.update({"gen_ai.completion.0.role": "assistant", "gen_ai.completion.0.content": call.content(index) or "",
                  "gen_ai.completion.0.finish_reason": call.finish_reason(index)})
    attrs.update(tool_attributes(call, index))
    return attrs


def tool_attributes(call: Call, index: int) -> dict[str, AttrValue]:
    """A call with tools: the definitions offered, the choice, the history's calls and results, the answer's
    calls (also as the GenAI semantic conventions' ``gen_ai.output.messages``), and how they were decoded."""
    tools = call.tools
    if tools is None:
        return {}
    attrs: dict[str, AttrValue] = {"gen_ai.request.tool_choice": tools.plan.choice,
                                   "litstream.constrained": tools.constrained}
    if tools.grammar is not None:  # the learner replays its masks to score the call as it was drawn
        attrs["litstream.grammar"] = tool_call_lark(tools.grammar)
    if tools.plan.tools:
        attrs["gen_ai.tool.definitions"] = json.dumps(tools.plan.definitions(), ensure_ascii=False)
    for n, turn in enumerate(tools.plan.turns):
        if turn.tool_calls:
            attrs[f"gen_ai.prompt.{n}.tool_calls"] = json.dumps([c.flat() for c in turn.tool_calls],
                                                                ensure_ascii=False)
        if turn.tool_call_id is not None:
            attrs[f"gen_ai.prompt.{n}.tool_call_id"] = turn.tool_call_id
    parsed, calls = tools.of(index), tools.calls(index)
    if calls:
        attrs["gen_ai.completion.0.tool_calls"] = json.dumps([c.flat() for c in calls], ensure_ascii=False)
    content = call.content(index)
    parts: list[dict[str, Any]] = [{"type": "text", "content": content}] if content else []
    parts += [{"type": "tool_call", "id": c.id, "name": c.name, "arguments": c.arguments_object()} for c in calls]
    attrs["gen_ai.output.messages"] = json.dumps([{"role": "assistant", "parts": parts,
                                                   "finish_reason": call.finish_reason(index)}], ensure_ascii=False)
    attrs["litstream.tool_calls.count"] = len(calls)
    attrs["litstream.tool_calls.malformed"] = parsed.malformed if parsed is not None else 0
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
