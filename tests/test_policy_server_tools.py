"""Tool calling on the policy endpoint: the parsers and templates (``workers/policy_server/tool_calls.py``), and the
endpoint itself through the real ``openai`` client on the real broker: forced calls of the tiny random policy
decoded under the grammar, ``auto`` with well-formed and malformed output, streaming against not, the 400s, a
history with calls and results, the span's tool attributes and the Prometheus counter."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import jsonschema
import openai
import pytest
import torch

from litstream.infra.metrics import StatsCollector
from litstream.infra.settings import Settings
from litstream.trainer.constrained import tool_call_lark
from litstream.trainer.engines import TorchEngine
from litstream.trainer.policy import build_policy, default_smollm2_cache
from litstream.trainer.tokenizer import ByteTokenizer, HFTokenizer
from litstream.workers.policy_server.backends import EngineBackend, Sampling, torch_backend
from litstream.workers.policy_server.openai_api import ApiError, ChatCompletionRequest
from litstream.workers.policy_server.process import ROLE, SERIES
from litstream.workers.policy_server.tool_calls import (
    GENERIC,
    HERMES,
    LLAMA3_JSON,
    ToolCall,
    answer_tools,
    generic_turns,
    plan_tools,
    template_tools,
)
from tests.policy_server_helpers import ServerThread, spans
from tests.waiting import until

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
                                            "celsius": {"type": "boolean"}},
           "required": ["city", "celsius"], "additionalProperties": False}
ADD = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                        "b": {"type": "integer", "minimum": 0, "maximum": 99}},
       "required": ["a", "b"], "additionalProperties": False}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "add", "description": "a + b", "parameters": ADD}},
]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
ASK: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
CALL = ToolCall("call_1", "get_weather", '{"city": "Paris", "celsius": true}')
HISTORY: list[Any] = [{"role": "system", "content": "Be brief."}, *ASK,
                      {"role": "assistant", "content": None, "tool_calls": [CALL.openai()]},
                      {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}]


def plan(messages: list[Any], **fields: Any) -> Any:
    return plan_tools(ChatCompletionRequest.model_validate({"model": "m", "messages": messages, **fields}))


def tiny_tools_engine(seed: int = 0) -> TorchEngine:
    """The tiny random policy with room for a tool preamble (its default context is 256 bytes)."""
    policy = build_policy("tiny", seed=seed, max_positions=2048)
    return TorchEngine(policy.model, policy.tokenizer, 0)


def client(server: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=300)


def valid_calls(calls: Any) -> list[tuple[str, Any]]:
    """(name, arguments) of each call, every one checked against its tool's schema."""
    out = []
    for c in calls:
        assert c.type == "function" and c.id.startswith("call_")
        arguments = json.loads(c.function.arguments)
        jsonschema.validate(arguments, SCHEMAS[c.function.name])
        out.append((c.function.name, arguments))
    return out


def call_spans(settings: Settings, count: int) -> dict[str, Any]:
    found = until(f"{count} spans", lambda: (lambda s: s if len(s) >= count else None)(spans(settings)))
    return {str(s.attributes["gen_ai.response.id"]): s.attributes for s in found}


# --- parsing ---------------------------------------------------------------------------------------------------


def test_the_hermes_form_keeps_calls_and_leaves_what_does_not_parse_as_content() -> None:
    tools = plan(ASK, tools=TOOLS).tools
    text = ('Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "celsius": false}}\n'
            '</tool_call>\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>')
    parsed = HERMES.parse(text, tools)
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [
        ("get_weather", {"city": "Oslo", "celsius": False}), ("add", {"a": 1, "b": 2})]
    assert parsed.content == "Checking." and parsed.malformed == 0
    assert [text[a:b] for a, b in parsed.spans][1].startswith("<tool_call>")
    # bad JSON, an unknown function, a block never closed: each counted, the text returned as content
    for bad in ('<tool_call>\n{"name": "add", "arguments": {"a": 1,}\n</tool_call>',
                '<tool_call>\n{"name": "rm", "arguments": {}}\n</tool_call>',
                '<tool_call>\n{"name": "add", "arguments": {"a": 1'):
        assert (p := HERMES.parse(bad, tools)).calls == [] and p.malformed == 1 and p.content == bad
    mixed = HERMES.parse('<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n'
                         '<tool_call>\n{"name": "add", "arguments": oops}\n</tool_call>', tools)
    assert len(mixed.calls) == 1 and mixed.malformed == 1 and mixed.content is not None and "oops" in mixed.content
    assert HERMES.parse("just text", tools).content == "just text"


def test_llama3_json_form_and_what_a_request_keeps() -> None:
    tools = plan(ASK, tools=TOOLS).tools
    one = LLAMA3_JSON.parse('<|python_tag|>{"name": "add", "parameters": {"a": 1, "b": 2}}', tools)
    assert [(c.name, c.arguments) for c in one.calls] == [("add", '{"a": 1, "b": 2}')] and one.content is None
    two = LLAMA3_JSON.parse('{"name": "add", "parameters": {"a": 1, "b": 2}}; {"name": "get_weather", '
                            '"parameters": {"city": "Lima", "celsius": true}}', tools)
    assert [c.name for c in two.calls] == ["add", "get_weather"]
    broken = LLAMA3_JSON.parse('{"name": "add", "parameters": {"a": 1', tools)
    assert broken.calls == [] and broken.malformed == 1 and broken.content == '{"name": "add", "parameters": {"a": 1'
    assert LLAMA3_JSON.parse("The answer is 3.", tools).malformed == 0
    # parallel_tool_calls false keeps one call; tool_choice none parses nothing
    text = GENERIC.write([CALL, ToolCall("call_2", "add", '{"a": 1, "b": 2}')])
    assert len(plan(ASK, tools=TOOLS).parse(text, GENERIC).calls) == 2
    assert len(plan(ASK, tools=TOOLS, parallel_tool_calls=False).parse(text, GENERIC).calls) == 1
    assert plan(ASK, tools=TOOLS, tool_choice="none").parse(text, GENERIC) is None


def test_forced_choices_build_the_grammar_of_the_templates_form() -> None:
    named = plan(ASK, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "add"}})
    grammar = named.grammar(HERMES)
    assert grammar is not None and [n for n, _ in grammar.tools] == ["add"] and not grammar.parallel
    assert json.loads(grammar.tools[0][1]) == ADD and grammar.begin == "<tool_call>\n"
    required = plan(ASK, tools=TOOLS, tool_choice="required")
    assert required.grammar(GENERIC).parallel and len(required.grammar(GENERIC).tools) == 2  # type: ignore[union-attr]
    assert not plan(ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False).grammar(GENERIC).parallel  # type: ignore[union-attr]
    llama = required.grammar(LLAMA3_JSON)
    assert llama is not None and llama.arguments_key == "parameters" and llama.begin == "" and not llama.parallel
    assert plan(ASK, tools=TOOLS).grammar(HERMES) is None  # auto: not constrained


def test_constrained_calls_share_a_batch_only_with_calls_of_the_same_grammar() -> None:
    backend = torch_backend(tiny_tools_engine(), "tiny", batch_window_s=0.05)
    named = plan(ASK, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "add"}})
    grammar = named.grammar(GENERIC)
    assert len({Sampling(9, grammar=g).batch_key for g in (None, grammar, plan(ASK, tools=TOOLS, tool_choice="required")
                                                            .grammar(GENERIC), grammar)}) == 3
    prompt = backend.tool_chat_prompt(named.turns, named.definitions())

    async def three() -> list[Any]:
        return list(await asyncio.gather(backend.generate(prompt, 1, Sampling(4)),
                                         *(backend.generate(prompt, 1, Sampling(90, grammar=grammar))
                                           for _ in range(2))))

    free, *forced = asyncio.run(three())
    assert sorted(backend.batch_sizes) == [1, 2] and len(free.generations[0].token_ids) <= 4
    for answer in forced:
        [call] = answer_tools(named, GENERIC, [answer.generations[0].text], constrained=True).calls(0)
        assert call.name == "add"
        jsonschema.validate(json.loads(call.arguments), ADD)
    backend.close()


# --- templates -------------------------------------------------------------------------------------------------

OWN_TEMPLATE = (  # a chat template that takes tools and writes calls in the Hermes form (written for this test)
    "{%- if tools %}<|system|>\nFunctions:\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}{% endif %}"
    "{%- for m in messages %}<|{{ m.role }}|>\n{% if m.content %}{{ m.content }}{% endif %}"
    "{%- for c in m.tool_calls or [] %}<tool_call>\n{\"name\": \"{{ c.function.name }}\", \"arguments\": "
    "{{ c.function.arguments | tojson }}}\n</tool_call>{% endfor %}\n{% endfor %}"
    "{%- if add_generation_prompt %}<|assistant|>\n{% endif %}")


def test_the_form_follows_the_chat_template() -> None:
    assert template_tools(None) == template_tools("{{ messages }}")
    assert template_tools(None).form is GENERIC and not template_tools(None).native
    assert template_tools(OWN_TEMPLATE).form is HERMES and template_tools(OWN_TEMPLATE).native
    llama = "{%- if tools %}{{ '<|start_header_id|>' }}{% endif %}{{ '<|python_tag|>' }}"
    assert template_tools(llama).form is LLAMA3_JSON
    assert template_tools("{% if tools %}[TOOL_CALLS]{% endif %}") == template_tools(None)  # a form not parsed here
    if (default_smollm2_cache() / "tokenizer_config.json").exists():
        from transformers import AutoTokenizer

        smol = AutoTokenizer.from_pretrained(str(default_smollm2_cache()))
        assert template_tools(smol.chat_template).form is GENERIC  # SmolLM2's template takes no tools


def test_the_generic_template_renders_tools_calls_and_results() -> None:
    turns = generic_turns(plan(HISTORY, tools=TOOLS).turns, plan(HISTORY, tools=TOOLS).definitions())
    system, user, assistant, tool = turns
    assert system[0] == "system" and system[1].startswith("Be brief.\n\nYou can call functions.")
    assert json.dumps(TOOLS[0]) in system[1] and '"name": <function name>' in system[1]
    assert user == ("user", "Weather in Paris?")
    assert assistant == ("assistant", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
                                      '"celsius": true}}\n</tool_call>')
    assert tool == ("tool", "<tool_response>\n18 C, sunny\n</tool_response>")
    assert generic_turns(plan(ASK, tools=TOOLS).turns, TOOLS)[0][0] == "system"  # no system message: one of its own


def test_a_template_that_takes_tools_renders_them_and_the_forced_call_is_its_form() -> None:
    hf = ByteTokenizer().to_hf()
    hf.chat_template = OWN_TEMPLATE
    tiny = build_policy("tiny", max_positions=2048)
    backend = EngineBackend(TorchEngine(tiny.model, HFTokenizer(hf)), HFTokenizer(hf), "own")
    assert backend.tool_template.native and backend.tool_template.form is HERMES
    history = plan(HISTORY, tools=TOOLS)
    rendered = backend.decode(backend.tool_chat_prompt(history.turns, history.definitions()))
    assert rendered.startswith("<|system|>\nFunctions:\n") and '"get_weather"' in rendered
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "celsius": true}}' in rendered
    forced = plan(ASK, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    prompt = backend.tool_chat_prompt(forced.turns, forced.definitions())
    answer = asyncio.run(backend.generate(prompt, 2, Sampling(120, seed=3, grammar=forced.grammar(HERMES))))
    parsed = answer_tools(forced, HERMES, [g.text for g in answer.generations], constrained=True)
    for i in range(2):
        [call] = parsed.calls(i)
        jsonschema.validate(json.loads(call.arguments), WEATHER)


def _next_prompt_extends(backend: EngineBackend, response: list[int]) -> tuple[bool, bool]:
    """Whether the prompt of the turn after a call starts with the call's prompt and its response tokens: with
    them all, and with all but the last (the end-of-sequence token)."""
    first = plan(ASK, tools=TOOLS)
    before = backend.tool_chat_prompt(first.turns, first.definitions())
    after = plan([*ASK, {"role": "assistant", "content": None, "tool_calls": [CALL.openai()]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}], tools=TOOLS)
    nxt = backend.tool_chat_prompt(after.turns, after.definitions())
    whole = before + response
    return nxt[: len(whole)] == whole, nxt[: len(whole) - 1] == whole[:-1]


def test_the_next_prompt_starts_with_the_previous_prompt_and_response() -> None:
    """The generic template renders a call exactly as the grammar makes the model write it. The byte tokenizer
    (the tiny policy) writes each text one way, so the next prompt holds the previous prompt and response, all but
    the final end-of-sequence token, which no plain-template turn contains. SmolLM2's template closes a turn with
    <|im_end|>, its end-of-sequence token (``trainer/tokenizer.py``), so the next prompt holds the whole response,
    when the call was sampled in the tokenizer's own split of the text (here it is; a grammar allows others, and
    SmolLM2 itself samples another: test_smollm2s_sampled_call_and_the_next_prompt)."""
    tiny = torch_backend(tiny_tools_engine(), "tiny")
    response = tiny.tokenizer.encode(GENERIC.write([CALL]), add_bos=False) + [tiny.tokenizer.eos_id]
    assert _next_prompt_extends(tiny, response) == (False, True)
    if not (default_smollm2_cache() / "tokenizer_config.json").exists():
        pytest.skip("SmolLM2's export is not in the model cache (make demo MODEL=smollm2 makes it)")
    smol = HFTokenizer.from_pretrained(default_smollm2_cache())
    backend = EngineBackend(tiny.engine, smol, "smollm2")
    response = smol.encode(GENERIC.write([CALL]), add_bos=False) + [smol.eos_id]
    assert _next_prompt_extends(backend, response) == (True, True)


@pytest.mark.slow(enabled_by="LITSTREAM_SMOLLM2")
def test_smollm2s_sampled_call_and_the_next_prompt() -> None:
    """SmolLM2 itself, forced to call (greedy, one call): the next prompt holds the call's text, but holds its
    sampled tokens only when they are the tokenizer's own split of that text. Measured: greedy SmolLM2 ends the
    arguments with '"}' '}' where the tokenizer writes '"' '}}', so the re-rendered history is other tokens."""
    from litstream.trainer.policy import load_smollm2

    policy = load_smollm2()
    backend = torch_backend(TorchEngine(policy.model, policy.tokenizer, 0), "smollm2")
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    forced = plan(ask, tools=tools, tool_choice="required", parallel_tool_calls=False)
    prompt = backend.tool_chat_prompt(forced.turns, forced.definitions())
    [gen] = asyncio.run(backend.generate(prompt, 1, Sampling(80, 0.0, grammar=forced.grammar(GENERIC)))).generations
    [call] = answer_tools(forced, GENERIC, [gen.text], constrained=True).calls(0)
    after = plan([*ask, {"role": "assistant", "content": None, "tool_calls": [call.openai()]},
                  {"role": "tool", "tool_call_id": call.id, "content": "18 C"}], tools=tools)
    nxt = backend.tool_chat_prompt(after.turns, after.definitions())
    assert gen.finish_reason == "stop" and nxt[: len(prompt)] == prompt
    assert backend.decode(nxt[len(prompt):]).startswith(gen.text)  # the text: always
    own_split = policy.tokenizer.encode(gen.text, add_bos=False) == gen.token_ids[:-1]
    assert (nxt[: len(prompt) + len(gen.token_ids) - 1] == prompt + gen.token_ids[:-1]) == own_split
    # the call ends where the model ends its turn: <|im_end|>, its generation config's eos (not the GGUF's)
    assert gen.token_ids[-1] == policy.tokenizer.eos_id == policy.model.generation_config.eos_token_id


# --- the endpoint ----------------------------------------------------------------------------------------------


def test_forced_calls_of_the_random_policy_are_valid_streamed_or_not(settings: Settings) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    with ServerThread(settings, torch_backend(tiny_tools_engine(), "tiny-policy")) as server:
        c = client(server)
        one = c.chat.completions.create(model="tiny-policy", messages=ASK, tools=TOOLS, tool_choice=named, n=2,
                                        max_tokens=300, logprobs=True, extra_body={"return_token_ids": True})
        some = c.chat.completions.create(model="tiny-policy", messages=ASK, tools=TOOLS, tool_choice="required",
                                         n=2, max_tokens=400)
        single = c.chat.completions.create(model="tiny-policy", messages=ASK, tools=TOOLS, tool_choice="required",
                                           parallel_tool_calls=False, n=2, max_tokens=300)
        asked: Any = {"model": "tiny-policy", "messages": ASK, "tools": TOOLS, "tool_choice": "required",
                      "max_tokens": 600, "seed": 11, "logprobs": True, "extra_body": {"return_token_ids": True}}
        whole = c.chat.completions.create(**asked)
        chunks = list(c.chat.completions.create(**asked, stream=True))
        short = c.chat.completions.create(model="tiny-policy", messages=ASK, tools=TOOLS, tool_choice=named,
                                          max_tokens=20)
        recorded = call_spans(settings, 9)
    for choice in one.choices:
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        [(name, _)] = valid_calls(choice.message.tool_calls)
        assert name == "get_weather"
    for choice in some.choices:
        assert choice.finish_reason == "tool_calls" and len(valid_calls(choice.message.tool_calls)) >= 1
    assert all(len(valid_calls(ch.message.tool_calls)) == 1 for ch in single.choices)
    _stream_agrees(whole, chunks)
    # cut by max_tokens before the call is whole: the text as content, counted, not an error
    assert short.choices[0].finish_reason == "length" and not short.choices[0].message.tool_calls
    assert str(short.choices[0].message.content).startswith("<tool_call>\n{")
    assert recorded[short.id]["litstream.tool_calls.malformed"] == 1

    span = recorded[f"{one.id}.0"]
    choice = one.choices[0]
    assert json.loads(span["gen_ai.tool.definitions"]) == TOOLS and span["gen_ai.request.tool_choice"] == "get_weather"
    assert span["litstream.constrained"] is True and span["litstream.tool_calls.count"] == 1
    # The grammar the call was decoded under (the named function alone), for the learner to replay its masks.
    assert span["litstream.grammar"] == tool_call_lark(plan(ASK, tools=TOOLS, tool_choice=named).grammar(GENERIC))
    assert span["litstream.tool_calls.malformed"] == 0 and span["gen_ai.completion.0.finish_reason"] == "tool_calls"
    assert json.loads(span["gen_ai.completion.0.tool_calls"]) == [
        {"id": t.id, "type": "function", "name": t.function.name, "arguments": t.function.arguments}
        for t in choice.message.tool_calls or []]
    [out] = json.loads(span["gen_ai.output.messages"])
    assert out["role"] == "assistant" and out["finish_reason"] == "tool_calls"
    assert [p["type"] for p in out["parts"]] == ["tool_call"]
    # the tokens recorded are those sampled, the call's included, ending with end-of-sequence
    assert choice.model_extra and span["response_token_ids"] == choice.model_extra["token_ids"]
    assert len(span["response_logprobs"]) == len(span["response_token_ids"])
    assert span["response_token_ids"][-1] == ByteTokenizer.eos_id
    assert "<tool_call>" in ByteTokenizer().decode(span["response_token_ids"])


def _stream_agrees(whole: Any, chunks: list[Any]) -> None:
    """The stream holds the same answer: content, calls (names and arguments, the ids the stream's own), finish
    reason, and every token's log-prob and id across its chunks."""
    [choice] = whole.choices
    deltas = [ch.choices[0] for ch in chunks if ch.choices]
    calls: dict[int, dict[str, Any]] = {}
    for d in deltas:
        for tc in d.delta.tool_calls or []:
            got = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
            got["id"] = tc.id or got["id"]
            if tc.function is not None:
                got["name"] += tc.function.name or ""
                got["arguments"] += tc.function.arguments or ""
    assert [(v["name"], v["arguments"]) for _, v in sorted(calls.items())] == [
        (t.function.name, t.function.arguments) for t in choice.message.tool_calls or []]
    assert all(str(v["id"]).startswith("call_") for v in calls.values())
    assert ("".join(d.delta.content or "" for d in deltas) or None) == choice.message.content
    assert deltas[-1].finish_reason == choice.finish_reason
    logprobs = [lp.logprob for d in deltas if d.logprobs for lp in d.logprobs.content or []]
    assert choice.logprobs is not None and logprobs == [lp.logprob for lp in choice.logprobs.content or []]
    assert [t for d in deltas for t in (d.model_extra or {}).get("token_ids", [])] == choice.model_extra["token_ids"]


def test_tool_requests_openai_refuses_are_400s_in_its_format(settings: Settings) -> None:
    weather = TOOLS[0]
    cases: list[tuple[dict[str, Any], str]] = [
        ({"tools": [{"type": "function", "function": {"parameters": WEATHER}}]}, "tools.0.function.name"),
        ({"tools": [{"type": "function", "function": {"name": "get weather!"}}]}, "tools.0.function.name"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}]},
         "tools.0.function.parameters"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
         "tools.0.function.parameters"),
        ({"tools": [weather], "tool_choice": {"type": "function", "function": {"name": "add"}}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"tools": [weather, weather]}, "tools"),
        ({"parallel_tool_calls": True}, "parallel_tool_calls"),
        ({"tools": [weather], "messages": [*ASK, {"role": "tool", "tool_call_id": "call_x", "content": "1"}]},
         "messages.1.tool_call_id"),
        ({"tools": [weather], "messages": [*ASK, {"role": "assistant", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": "[1]"}}]}]},
         "messages.1.tool_calls.0.function.arguments"),
        ({"functions": [{"name": "f"}]}, "functions"),
    ]
    with ServerThread(settings, torch_backend(tiny_tools_engine(), "tiny-policy")) as server:
        c = client(server)
        for fields, param in cases:
            body = {"model": "m", "messages": ASK, "max_tokens": 2, **fields}
            with pytest.raises(openai.BadRequestError) as refused:
                c.chat.completions.create(**body)
            assert refused.value.status_code == 400, fields
            error = refused.value.body
            assert isinstance(error, dict) and error["param"] == param and error["type"] == "invalid_request_error"
        assert c.chat.completions.create(model="m", messages=ASK, tools=TOOLS, max_tokens=2).choices  # still serves


# --- auto: a policy taught to write a call, and to write one that does not parse ------------------------------------

PING: list[Any] = [{"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}}]


def taught_engine(lessons: list[tuple[str, str]]) -> TorchEngine:
    """The tiny policy, with a chat template that takes tools (``OWN_TEMPLATE``: short prompts, so it learns
    fast), trained until its greedy answer to each question (offered ``PING``) is the given text: a model that
    writes calls by itself, as a trained one does, without a grammar."""
    hf = ByteTokenizer().to_hf()
    hf.chat_template = OWN_TEMPLATE
    tok = HFTokenizer(hf)
    policy = build_policy("tiny", seed=1, max_positions=2048)
    backend = EngineBackend(TorchEngine(policy.model, tok), tok, "shape")
    pairs = [(backend.tool_chat_prompt(plan([{"role": "user", "content": q}], tools=PING).turns, PING),
              tok.encode(a, add_bos=False) + [tok.eos_id]) for q, a in lessons]
    width = max(len(p) + len(a) for p, a in pairs)
    ids, labels = torch.full((len(pairs), width), tok.pad_id), torch.full((len(pairs), width), -100)
    mask = torch.zeros((len(pairs), width), dtype=torch.long)
    for row, (prompt, answer) in enumerate(pairs):
        ids[row, : len(prompt) + len(answer)] = torch.tensor(prompt + answer)
        labels[row, len(prompt): len(prompt) + len(answer)] = torch.tensor(answer)
        mask[row, : len(prompt) + len(answer)] = 1
    model = policy.model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(400):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if float(loss.detach()) < 0.01:
            break
    engine = TorchEngine(model.eval(), tok, 0)
    for prompt, answer in pairs:
        assert engine.generate([prompt], len(answer) + 4, temperature=0.0)[0].token_ids == answer
    return engine


def test_auto_returns_calls_it_can_read_and_the_rest_as_content(settings: Settings) -> None:
    good = '<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>'
    broken = "<tool_call>\n{oops}\n</tool_call>"
    engine = taught_engine([("a?", good), ("b?", broken)])
    calls, bad = [{"role": "user", "content": "a?"}], [{"role": "user", "content": "b?"}]
    with ServerThread(settings, torch_backend(engine, "tiny-policy")) as server:
        c = client(server)
        asked: Any = {"model": "m", "messages": calls, "tools": PING, "temperature": 0, "max_tokens": 80,
                      "logprobs": True, "extra_body": {"return_token_ids": True}}
        called = c.chat.completions.create(**asked)
        streamed = list(c.chat.completions.create(**asked, stream=True))
        cut = c.chat.completions.create(model="m", messages=bad, tools=PING, temperature=0, max_tokens=80)
        plain = c.chat.completions.create(model="m", messages=calls, tools=PING, tool_choice="none", temperature=0,
                                          max_tokens=80)
        recorded = call_spans(settings, 4)
        report = server.running.report
    [tool_call] = called.choices[0].message.tool_calls or []
    assert tool_call.function.name == "ping" and json.loads(tool_call.function.arguments) == {}
    assert called.choices[0].finish_reason == "tool_calls" and called.choices[0].message.content is None
    assert recorded[called.id]["litstream.constrained"] is False
    _stream_agrees(called, streamed)
    # a call that does not parse: the text as content, counted (span and Prometheus), never an error
    assert cut.choices[0].message.content == broken and not cut.choices[0].message.tool_calls
    assert cut.choices[0].finish_reason == "stop"
    span = recorded[cut.id]
    assert span["litstream.tool_calls.malformed"] == 1 and span["litstream.tool_calls.count"] == 0
    assert span["gen_ai.request.tool_choice"] == "auto" and "gen_ai.completion.0.tool_calls" not in span
    metrics = {s.name: s.samples[0].value for s in StatsCollector(ROLE, report, SERIES).collect()}
    assert metrics["litstream_policy_tool_calls_malformed"] == 1 and metrics["litstream_policy_tool_calls"] == 2
    # none: nothing parsed, the call's text is the content
    assert plain.choices[0].message.content == good and not plain.choices[0].message.tool_calls
    assert plain.choices[0].finish_reason == "stop"


def test_a_history_with_calls_and_results_is_rendered_and_recorded(settings: Settings) -> None:
    backend = torch_backend(tiny_tools_engine(), "tiny-policy")
    with ServerThread(settings, backend) as server:
        answer = client(server).chat.completions.create(model="m", messages=HISTORY, tools=TOOLS, max_tokens=4)
        recorded = call_spans(settings, 1)
    span = recorded[answer.id]
    history = plan(HISTORY, tools=TOOLS)
    assert span["prompt_token_ids"] == backend.tool_chat_prompt(history.turns, TOOLS)
    rendered = backend.decode(span["prompt_token_ids"])  # type: ignore[arg-type]
    assert GENERIC.write([CALL]) + "\n<|tool|>\n<tool_response>\n18 C, sunny\n</tool_response>\n" in rendered
    assert json.loads(span["gen_ai.prompt.2.tool_calls"]) == [CALL.flat()]
    assert span["gen_ai.prompt.2.role"] == "assistant" and span["gen_ai.prompt.2.content"] == ""
    assert span["gen_ai.prompt.3.tool_call_id"] == "call_1" and span["gen_ai.prompt.3.content"] == "18 C, sunny"
    # without tools offered, the history is still rendered with its calls (and nothing is parsed)
    bare = plan(HISTORY)
    assert bare.used and not bare.tools and bare.choice == "none"


def test_a_grammar_the_decoder_cannot_compile_is_a_400() -> None:
    backend = torch_backend(tiny_tools_engine(), "tiny")
    odd = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "string", "format": "no-such-format", "pattern": "(?<=a)b"}},
        "required": ["x"]}}}
    forced = plan(ASK, tools=[odd], tool_choice="required")
    prompt = backend.tool_chat_prompt(forced.turns, forced.definitions())
    with pytest.raises(ApiError) as refused:
        asyncio.run(backend.generate(prompt, 1, Sampling(20, grammar=forced.grammar(GENERIC))))
    assert refused.value.status == 400 and refused.value.param == "tools"
