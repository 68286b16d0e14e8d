"""Constrained decoding of forced tool calls (trainer/constrained.py) on the torch engine with the random tiny
policy, and the vLLM request that carries the same grammar. A random policy puts no weight of its own on a call's
text, so every call below is the grammar's doing."""

from __future__ import annotations

import json
import re

import jsonschema
import llguidance
import pytest
import torch

from litstream.trainer.constrained import (
    ToolCallGrammar,
    compile_lark,
    compile_tool_call_grammar,
    replay_allowed,
    tool_call_lark,
)
from litstream.trainer.engines import Generation, TorchEngine, completion_body, tempered_logprobs
from litstream.trainer.policy import build_policy
from litstream.trainer.tokenizer import ByteTokenizer, HFTokenizer, align_with_model

HERMES = {"begin": "<tool_call>\n", "end": "\n</tool_call>"}
# Strings and arrays are bounded so that a random policy's calls end within the token budget.
WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
           "properties": {"city": {"type": "string", "maxLength": 10},
                          "unit": {"enum": ["celsius", "fahrenheit"]},
                          "days": {"type": "integer", "minimum": 1, "maximum": 7}}}
ORDER = {"type": "object", "additionalProperties": False, "required": ["items", "express", "address"],
         "properties": {
             "items": {"type": "array", "minItems": 1, "maxItems": 2,
                       "items": {"type": "object", "additionalProperties": False, "required": ["sku", "qty"],
                                 "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"},
                                                "qty": {"type": "integer", "minimum": 1, "maximum": 9}}}},
             "express": {"type": "boolean"},
             "price": {"type": "number", "minimum": 0, "maximum": 100},
             "note": {"anyOf": [{"type": "string", "maxLength": 8}, {"type": "null"}]},
             "address": {"type": "object", "additionalProperties": False, "required": ["zip"],
                         "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}}}}}
DEFS = {"type": "object", "additionalProperties": False, "required": ["level"],
        "properties": {"level": {"$ref": "#/$defs/level"}},
        "$defs": {"level": {"enum": ["low", "high"]}}}
NO_ARGS = {"type": "object", "properties": {}, "additionalProperties": False}
TOOLS = {"get_weather": WEATHER, "place_order": ORDER, "set_level": DEFS, "now": NO_ARGS}
CALL = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.S)
STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


@pytest.fixture(scope="module")
def tiny() -> TorchEngine:
    policy = build_policy("tiny")
    return TorchEngine(policy.model, policy.tokenizer)


def grammar(*names: str, parallel: bool = False) -> ToolCallGrammar:
    return ToolCallGrammar(tools=tuple((n, json.dumps(TOOLS[n])) for n in names), parallel=parallel, **HERMES)


def assert_valid_call(body_text: str, names: tuple[str, ...], key: str = "arguments") -> dict[str, object]:
    body = json.loads(body_text)
    assert list(body) == ["name", key] and body["name"] in names
    jsonschema.validate(body[key], TOOLS[body["name"]])
    # json.dumps's spacing: outside strings, one space after each "," and ":" and no other whitespace.
    assert re.fullmatch(r"(?:[^\s,:]|[,:] )*", STRING.sub('""', body_text))
    return body


def one_call(g: Generation) -> dict[str, object]:
    assert g.finish_reason == "stop" and g.token_ids[-1] == 258  # the byte tokenizer's eos, after the call
    assert g.text.startswith(HERMES["begin"]) and g.text.endswith(HERMES["end"])
    return assert_valid_call(g.text.removeprefix(HERMES["begin"]).removesuffix(HERMES["end"]), tuple(TOOLS))


@pytest.mark.parametrize("name", list(TOOLS))
@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_forced_call_of_each_tool_parses_and_validates(tiny: TorchEngine, name: str, temperature: float) -> None:
    prompts = [tiny.tokenizer.encode("call it: "), tiny.tokenizer.encode("x")] * (2 if temperature else 1)
    for g in tiny.generate(prompts, 300, temperature=temperature, seed=3, grammar=grammar(name)):
        assert one_call(g)["name"] == name


def test_required_call_picks_among_tools_under_top_p(tiny: TorchEngine) -> None:
    g = grammar(*TOOLS)
    gens = tiny.generate([tiny.tokenizer.encode("go")] * 8, 300, temperature=1.0, top_p=0.8, seed=11, grammar=g)
    names = {one_call(x)["name"] for x in gens}
    assert len(names) > 1  # the grammar leaves the choice of tool to the policy


def test_llama_json_form_without_tags(tiny: TorchEngine) -> None:
    g = ToolCallGrammar(tools=(("get_weather", json.dumps(WEATHER)),), begin="", end="", arguments_key="parameters")
    for x in tiny.generate([tiny.tokenizer.encode("q")] * 4, 200, temperature=1.0, seed=5, grammar=g):
        assert x.finish_reason == "stop"
        assert_valid_call(x.text, ("get_weather",), key="parameters")


def test_parallel_grammar_yields_one_or_more_calls(tiny: TorchEngine) -> None:
    g = grammar("get_weather", "now", parallel=True)
    gens = tiny.generate([tiny.tokenizer.encode("go")] * 6, 400, temperature=1.0, seed=3, grammar=g)
    counts = []
    for x in gens:
        assert x.finish_reason == "stop"
        bodies = CALL.findall(x.text)
        assert bodies and "\n".join(f"<tool_call>\n{b}\n</tool_call>" for b in bodies) == x.text
        for b in bodies:
            assert_valid_call(b, ("get_weather", "now"))
        counts.append(len(bodies))
    assert max(counts) > 1


def test_single_call_grammar_stops_after_one_call(tiny: TorchEngine) -> None:
    for x in tiny.generate([tiny.tokenizer.encode("go")] * 6, 300, temperature=1.0, seed=4, grammar=grammar("now")):
        assert len(CALL.findall(x.text)) == 1 and x.token_ids.count(258) == 1


def test_cut_call_finishes_with_length(tiny: TorchEngine) -> None:
    (g,) = tiny.generate([tiny.tokenizer.encode("go")], 5, temperature=1.0, seed=1, grammar=grammar("get_weather"))
    assert g.finish_reason == "length" and g.text == "<tool"


def recomputed(engine: TorchEngine, g: Generation, temperature: float, lark: str) -> torch.Tensor:
    """The model's log-probs of ``g``'s tokens after its prompt, tempered and masked to what the grammar allowed
    (replayed): what the learner scores."""
    ids = torch.tensor([g.prompt_token_ids + g.token_ids[:-1]])
    with torch.no_grad():
        logits = engine.model(input_ids=ids).logits[0, len(g.prompt_token_ids) - 1:]
    allowed = replay_allowed(compile_lark(engine.tokenizer, lark, logits.shape[-1]), g.token_ids)
    masked = tempered_logprobs(logits, temperature).masked_fill(~torch.from_numpy(allowed), float("-inf"))
    return torch.log_softmax(masked, dim=-1).gather(1, torch.tensor(g.token_ids)[:, None]).squeeze(1)


@pytest.mark.parametrize("temperature", [0.7, 0.0])
def test_logprobs_are_those_of_the_masked_distribution(tiny: TorchEngine, temperature: float) -> None:
    prompts = [tiny.tokenizer.encode("a"), tiny.tokenizer.encode("a longer prompt, left-padded")]
    g_weather = grammar("get_weather")
    gens = tiny.generate(prompts, 200, temperature=temperature, seed=9, grammar=g_weather)
    for g in gens:
        want = recomputed(tiny, g, temperature, tool_call_lark(g_weather))
        assert torch.allclose(torch.tensor(g.logprobs), want, atol=1e-4, rtol=0)
        # The grammar forces most of the call's bytes: drawn with no choice, their log-prob is 0.
        assert sum(1 for x in g.logprobs if abs(x) < 1e-6) > len(g.logprobs) // 2


# Sampled by the engine before constrained decoding existed (tiny policy, seed 7, 12 tokens).
BEFORE = {1.0: [[200, 173, 106, 165, 155, 140, 149, 0, 111, 253, 184, 157],
                [168, 78, 67, 168, 91, 181, 206, 237, 180, 46, 118, 97]],
          0.0: [[109, 184, 62, 64, 73, 64, 73, 64, 109, 47, 221, 64], [80] * 12]}


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_unconstrained_generation_is_unchanged(tiny: TorchEngine, temperature: float) -> None:
    prompts = [tiny.tokenizer.encode("cx2="), tiny.tokenizer.encode("a longer prompt")]
    gens = tiny.generate(prompts, 12, temperature=temperature, seed=7)
    assert [g.token_ids for g in gens] == BEFORE[temperature]
    again = tiny.generate(prompts, 12, temperature=temperature, seed=7, grammar=None)
    assert [g.logprobs for g in again] == [g.logprobs for g in gens]


def test_byte_level_tokenizer_with_a_gguf_style_decoder(tiny: TorchEngine) -> None:
    """A byte-level BPE converted from GGUF (SmolLM2's) carries a SentencePiece-style decoder sequence: the engine
    still reads its tokens as bytes ("Ċ" is a newline), so the call's newlines can be sampled and accepted."""
    from tokenizers import decoders

    hf = ByteTokenizer().to_hf()
    hf.backend_tokenizer.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse(),
                                                      decoders.Replace("\u2581", " "), decoders.ByteLevel()])
    engine = TorchEngine(tiny.model, HFTokenizer(hf))
    for g in engine.generate([[1, 2, 3]] * 3, 200, temperature=1.0, seed=1, grammar=grammar("get_weather")):
        assert one_call(g)["name"] == "get_weather"


def test_a_converted_tokenizer_is_aligned_with_its_model() -> None:
    """SmolLM2's GGUF conversion names <|im_start|> end-of-sequence and pads with it, where the model ends its turns
    with <|im_end|> (its generation config's eos), and gives its byte-level BPE a SentencePiece-style decoder. The
    loaders align both, so generation, grammars and vLLM stop at the end of the turn and read bytes as bytes."""
    from types import SimpleNamespace

    from tokenizers import decoders

    hf = ByteTokenizer().to_hf()
    hf.eos_token = hf.pad_token = "<s>"  # as converted: the wrong special token ends sequences
    hf.backend_tokenizer.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse(),
                                                      decoders.Replace("\u2581", " "), decoders.ByteLevel()])
    model = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=[ByteTokenizer.eos_id]))
    tok = HFTokenizer(align_with_model(hf, model))
    assert (tok.eos_id, tok.pad_id) == (ByteTokenizer.eos_id, ByteTokenizer.eos_id)
    assert json.loads(hf.backend_tokenizer.to_str())["decoder"]["type"] == "ByteLevel"
    text = "a call:\n\t{\"city\": \"Zürich\"}"
    assert tok.decode(tok.encode(text, add_bos=False)) == text
    aligned = hf.backend_tokenizer.to_str()
    assert align_with_model(hf, model).backend_tokenizer.to_str() == aligned  # aligning twice changes nothing


def test_grammar_compiles_once_per_tokenizer_and_tool_set(tiny: TorchEngine) -> None:
    a = compile_tool_call_grammar(tiny.tokenizer, grammar("get_weather", "now"), 259)
    assert compile_tool_call_grammar(tiny.tokenizer, grammar("get_weather", "now"), 259) is a
    assert compile_tool_call_grammar(tiny.tokenizer, grammar("now", "get_weather"), 259) is not a


def test_lark_text_of_a_grammar() -> None:
    g = ToolCallGrammar(tools=(("now", '{"properties": {}}'),), begin="<tool_call>\n", end="\n</tool_call>",
                        parallel=True)
    assert tool_call_lark(g) == (
        'start: call ("\\n" call)*\n'
        'call: "<tool_call>\\n" body "\\n</tool_call>"\n'
        "body: body0\n"
        'body0: "{\\"name\\": \\"now\\", \\"arguments\\": " args0 "}"\n'
        'args0: %json {"properties": {}, "additionalProperties": false, "type": "object", "x-guidance": '
        '{"whitespace_flexible": false, '
        '"item_separator": ", ", "key_separator": ": "}}\n')
    # vLLM's guidance backend reads a `grammar` as Lark or GBNF, whichever it is: this text must stay Lark.
    assert llguidance.grammar_from("grammar", tool_call_lark(g)) == llguidance.grammar_from("lark", tool_call_lark(g))


def test_vllm_request_carries_the_grammar() -> None:
    g = ToolCallGrammar(tools=(("now", '{"type": "object"}'),), begin="", end="")
    body = completion_body("policy", [[1, 2, 3]], 64, 1.0, 0.9, seed=4, grammar=g)
    assert body == {
        "model": "policy", "prompt": [[1, 2, 3]], "max_tokens": 64, "temperature": 1.0, "top_p": 0.9,
        "logprobs": 0, "return_tokens_as_token_ids": True, "return_token_ids": True, "skip_special_tokens": False,
        "seed": 4,
        "structured_outputs": {"grammar": (
            "start: call\ncall: body\nbody: body0\n"
            'body0: "{\\"name\\": \\"now\\", \\"arguments\\": " args0 "}"\n'
            'args0: %json {"type": "object", "x-guidance": {"whitespace_flexible": false, '
            '"item_separator": ", ", "key_separator": ": "}}\n')},
    }
    assert "structured_outputs" not in completion_body("policy", [[1]], 8, 0.0, 1.0)


@pytest.mark.parametrize("tools, why", [
    ((), "at least one tool"),
    ((("a", "{}"), ("a", "{}")), "repeat"),
    ((("", "{}"),), "non-empty name"),
    ((("a", "{not json"),), "not a JSON Schema in JSON"),
    ((("a", '"string"'),), "must be a JSON Schema object"),
    ((("a", '{"type": "array"}'),), "must be an object schema"),
])
def test_bad_grammars_are_refused_with_the_reason(tools: tuple[tuple[str, str], ...], why: str) -> None:
    with pytest.raises(ValueError, match=why):
        tool_call_lark(ToolCallGrammar(tools=tools, begin="", end=""))


def test_schema_the_library_cannot_enforce_names_the_tool(tiny: TorchEngine) -> None:
    bad = ToolCallGrammar(tools=(("now", "{}"), ("tag", '{"properties": {"t": {"not": {"type": "string"}}}}')),
                          begin="", end="")
    with pytest.raises(ValueError, match="tool 'tag'.*not"):
        tiny.generate([[1]], 8, grammar=bad)


def test_an_open_schema_is_closed_so_a_forced_call_ends(tiny: TorchEngine) -> None:
    """LangChain's and MCP's schemas say nothing of other properties; a forced call adds none and ends."""
    from litstream.trainer.constrained import closed

    open_schema = {"type": "object", "required": ["city"], "properties": {
        "city": {"type": "string", "maxLength": 8},
        "when": {"type": "object", "properties": {"day": {"type": "integer", "minimum": 1, "maximum": 7}}}}}
    shut = closed(open_schema)
    assert shut["additionalProperties"] is False and shut["properties"]["when"]["additionalProperties"] is False
    assert "additionalProperties" not in open_schema  # the tool's own schema is left as it was
    g = ToolCallGrammar(tools=(("weather", json.dumps(open_schema)),), **HERMES)
    for x in tiny.generate([tiny.tokenizer.encode("go")] * 4, 300, temperature=1.0, seed=7, grammar=g):
        assert x.finish_reason == "stop"
        body = json.loads(x.text.removeprefix(HERMES["begin"]).removesuffix(HERMES["end"]))
        jsonschema.validate(body["arguments"], open_schema)
        assert set(body["arguments"]) <= {"city", "when"}
