"""The structured-generation libraries compared for forced tool calls on the torch engine (the figures behind
docs/perf/constrained-decoding.md): llguidance, xgrammar, outlines (outlines-core) and lm-format-enforcer.

``python -m bench.constrained_libraries [--models tiny,smollm2] [--samples N]`` (OMP_NUM_THREADS=1 is set here).
Only llguidance is a dependency (the ``train`` extra); the others are measured where they import, e.g. installed
aside with ``pip install --target DIR xgrammar outlines lm-format-enforcer`` and ``PYTHONPATH=DIR``.

Each library drives the same engine loop (``TorchEngine.generate_constrained``) through a ``TokenConstraint`` per
sequence, for the same tool set (the JSON Schema features tools use). Per library and model:

* compile: seconds from the tool set to the first sequence's state (the tokenizer's own preparation apart);
* tokens per CPU-second of the batch (CPU time of this single-threaded process, not wall time: the machine was
  shared), constrained and plain, at batch 1 and 8: both runs take the same number of steps (the constrained
  run's longest call, at most 128), so the ratio is what the mask costs per step;
* correctness (tiny random policy, temperature 1.0): of N forced calls, how many ended within the token budget,
  parsed (begin/end stripped, json.loads), validated against the tool's schema with jsonschema, and kept
  json.dumps's separators with no other whitespace.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import json
import re
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from litstream.trainer.constrained import TokenConstraint, ToolCallGrammar, compile_tool_call_grammar
from litstream.trainer.engines import TorchEngine
from litstream.trainer.policy import Policy, build_policy

_TRAVELLER = {"type": "object", "additionalProperties": False, "required": ["name"],
              "properties": {"name": {"type": "string", "maxLength": 10},
                             "age": {"type": "integer", "minimum": 0, "maximum": 120}}}
# One schema with every feature (required, nested object, array of objects, enum, integer, number, boolean,
# string, anyOf with null, additionalProperties false); strings and arrays are bounded so that a random policy
# ends its call within the token budget.
BOOK_TRIP = {
    "type": "object", "additionalProperties": False,
    "required": ["destination", "nights", "cabin", "travellers", "address"],
    "properties": {
        "destination": {"type": "string", "maxLength": 12},
        "nights": {"type": "integer", "minimum": 1, "maximum": 14},
        "budget": {"type": "number", "minimum": 0, "maximum": 5000},
        "refundable": {"type": "boolean"},
        "cabin": {"enum": ["economy", "business", "first"]},
        "travellers": {"type": "array", "items": _TRAVELLER, "minItems": 1, "maxItems": 3},
        "notes": {"anyOf": [{"type": "string", "maxLength": 20}, {"type": "null"}]},
        "address": {"type": "object", "additionalProperties": False, "required": ["city", "zip"],
                    "properties": {"city": {"type": "string", "maxLength": 10},
                                   "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}},
    },
}
SEARCH = {"type": "object", "additionalProperties": False, "required": ["query"],
          "properties": {"query": {"type": "string", "maxLength": 16},
                         "limit": {"type": "integer", "minimum": 1, "maximum": 50}}}
NOW = {"type": "object", "properties": {}, "additionalProperties": False}
SCHEMAS = {"book_trip": BOOK_TRIP, "search": SEARCH, "now": NOW}
GRAMMAR = ToolCallGrammar(tools=tuple((n, json.dumps(s)) for n, s in SCHEMAS.items()),
                          begin="<tool_call>\n", end="\n</tool_call>")
HEAD = '{{"name": {name}, "arguments": '  # the text before a call's arguments, as tool_call_lark writes it
PROMPT = ("<|im_start|>system\nYou call tools. Answer with one call inside <tool_call></tool_call> tags.<|im_end|>\n"
          "<|im_start|>user\nBook a trip to Lisbon for two nights, economy, for Ana (34), address Porto 40000."
          "<|im_end|>\n<|im_start|>assistant\n")

Factory = Callable[[int], list[TokenConstraint]]  # n -> fresh states


@dataclass
class Candidate:
    name: str
    prepare: Callable[[Policy, int], Any]  # (policy, vocab) -> the library's tokenizer data (timed apart)
    compile: Callable[[Any, Policy, int], Factory]  # (tokenizer data, policy, vocab) -> factory


# --- llguidance (the engine's own path) ------------------------------------------------------------------------


def _llg_prepare(policy: Policy, vocab: int) -> Any:
    from litstream.trainer import constrained

    with constrained._lock:
        return constrained._ll_tokenizer(policy.tokenizer, vocab)


def _llg_compile(_: Any, policy: Policy, vocab: int) -> Factory:
    from litstream.trainer import constrained

    constrained._compiled.pop(policy.tokenizer, None)  # time a compile, not a cache hit
    return compile_tool_call_grammar(policy.tokenizer, GRAMMAR, vocab).start


# --- xgrammar --------------------------------------------------------------------------------------------------


class _XgrConstraint:
    def __init__(self, matcher: Any) -> None:
        self.matcher = matcher

    def fill_bitmask(self, row: np.ndarray[Any, Any]) -> None:
        self.matcher.fill_next_token_bitmask(torch.from_numpy(row).unsqueeze(0), 0)

    def accept(self, token: int) -> None:
        if not self.matcher.accept_token(token):
            raise RuntimeError(f"xgrammar rejected token {token}")

    def is_finished(self) -> bool:
        return False  # its mask allows only the stop token once the grammar is complete


def _xgr_prepare(policy: Policy, vocab: int) -> Any:
    import xgrammar as xgr

    # The raw bytes of every token: from_huggingface does not recognise the byte tokenizer as byte-level and
    # would take its tokens' printable stand-ins for text.
    raw = _token_table(policy, vocab)
    info = xgr.TokenizerInfo(raw, xgr.VocabType.RAW, vocab_size=vocab, stop_token_ids=[policy.tokenizer.eos_id])
    return xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)


def _xgr_compile(compiler: Any, policy: Policy, vocab: int) -> Factory:
    import xgrammar as xgr

    def text(s: str) -> Any:
        return xgr.Grammar.from_ebnf(f"root ::= {json.dumps(s)}")

    bodies = [xgr.Grammar.concat(text(HEAD.format(name=json.dumps(n))),
                                 xgr.Grammar.from_json_schema(json.dumps(s), any_whitespace=False,
                                                              separators=(", ", ": ")),
                                 text("}"))
              for n, s in SCHEMAS.items()]
    compiled = compiler.compile_grammar(xgr.Grammar.concat(text(GRAMMAR.begin), xgr.Grammar.union(*bodies),
                                                           text(GRAMMAR.end)))
    return lambda n: [_XgrConstraint(xgr.GrammarMatcher(compiled)) for _ in range(n)]


# --- outlines (outlines-core: a regex index over the vocabulary) -------------------------------------------------


class _OutlinesConstraint:
    def __init__(self, guide: Any) -> None:
        self.guide = guide

    def fill_bitmask(self, row: np.ndarray[Any, Any]) -> None:
        self.guide.write_mask_into(row.ctypes.data, row.size, 4)

    def accept(self, token: int) -> None:
        self.guide.advance(token_id=token, return_tokens=False)

    def is_finished(self) -> bool:
        return bool(self.guide.is_finished())


def _outlines_prepare(policy: Policy, vocab: int) -> Any:
    from outlines_core import Vocabulary

    tokens: dict[bytes, list[int]] = {}
    for tid, piece in enumerate(_token_table(policy, vocab)):
        if piece and tid != policy.tokenizer.eos_id:
            tokens.setdefault(piece, []).append(tid)
    return Vocabulary(policy.tokenizer.eos_id, tokens)


def _outlines_compile(vocabulary: Any, policy: Policy, vocab: int) -> Factory:
    from outlines_core import Guide, Index
    from outlines_core.json_schema import build_regex_from_schema

    # outlines-core's JSON regexes take one whitespace pattern for every gap: an optional single space is the
    # nearest it comes to json.dumps's separators.
    bodies = [re.escape(HEAD.format(name=json.dumps(n))) + build_regex_from_schema(json.dumps(s), r"[ ]?")
              + re.escape("}") for n, s in SCHEMAS.items()]
    regex = re.escape(GRAMMAR.begin) + "(" + "|".join(bodies) + ")" + re.escape(GRAMMAR.end)
    index = Index(regex, vocabulary)
    return lambda n: [_OutlinesConstraint(Guide(index)) for _ in range(n)]


# --- lm-format-enforcer ----------------------------------------------------------------------------------------


class _LmfeConstraint:
    def __init__(self, enforcer: Any) -> None:
        self.enforcer = enforcer
        self.tokens: list[int] = []

    def fill_bitmask(self, row: np.ndarray[Any, Any]) -> None:
        allowed = self.enforcer.get_allowed_tokens(self.tokens).allowed_tokens
        row[:] = allowed.numpy()[: row.size]

    def accept(self, token: int) -> None:
        self.tokens.append(token)

    def is_finished(self) -> bool:
        return False


def _lmfe_prepare(policy: Policy, vocab: int) -> Any:
    from lmformatenforcer.integrations.transformers import build_token_enforcer_tokenizer_data

    return build_token_enforcer_tokenizer_data(_hf(policy), use_bitmask=True, vocab_size=vocab)


def _lmfe_compile(data: Any, policy: Policy, vocab: int) -> Factory:
    from lmformatenforcer import JsonSchemaParser, SequenceParser, StringParser, TokenEnforcer, UnionParser

    def parser() -> Any:
        bodies = [SequenceParser([StringParser(HEAD.format(name=json.dumps(n))), JsonSchemaParser(s),
                                  StringParser("}")]) for n, s in SCHEMAS.items()]
        return SequenceParser([StringParser(GRAMMAR.begin), UnionParser(bodies), StringParser(GRAMMAR.end)])

    TokenEnforcer(data, parser()).get_allowed_tokens([])  # the first mask: where its parsers get built
    return lambda n: [_LmfeConstraint(TokenEnforcer(data, parser())) for _ in range(n)]


CANDIDATES = [
    Candidate("llguidance", _llg_prepare, _llg_compile),
    Candidate("xgrammar", _xgr_prepare, _xgr_compile),
    Candidate("outlines", _outlines_prepare, _outlines_compile),
    Candidate("lm-format-enforcer", _lmfe_prepare, _lmfe_compile),
]


def _hf(policy: Policy) -> Any:
    to_hf = getattr(policy.tokenizer, "to_hf", None)
    return to_hf() if callable(to_hf) else policy.tokenizer.tok  # type: ignore[attr-defined]


def _token_table(policy: Policy, vocab: int) -> list[bytes]:
    """The bytes each token stands for (empty for special tokens and ids past the tokenizer)."""
    if policy.kind == "tiny":
        return [bytes([t]) if t < 256 else b"" for t in range(vocab)]
    from transformers.models.gpt2.tokenization_gpt2 import bytes_to_unicode

    hf = _hf(policy)
    byte_of = {ch: b for b, ch in bytes_to_unicode().items()}
    special = set(hf.all_special_ids)
    table = []
    for tid, piece in enumerate(hf.convert_ids_to_tokens(list(range(min(vocab, len(hf)))))):
        if tid in special:
            table.append(b"")
        else:
            table.append(bytes(byte_of[c] for c in piece) if all(c in byte_of for c in piece) else piece.encode())
    return table + [b""] * (vocab - len(table))


# --- measuring -------------------------------------------------------------------------------------------------


@dataclass
class Figures:
    library: str
    model: str
    prepare_s: float
    compile_s: float
    rates: dict[int, tuple[float, float]]  # batch -> (plain steps/s, constrained steps/s)
    correct: dict[str, int]


def _rate(engine: TorchEngine, prompt: list[int], batch: int, steps: int, factory: Factory | None,
          temperature: float) -> float:
    """Steps per CPU-second of a batch taking at most ``steps`` steps. CPU time of this process (one thread),
    not wall time: the figures were taken on a machine shared with other work."""
    t0 = time.process_time()
    gens = engine.generate_constrained([prompt] * batch, steps, temperature, seed=0,
                                       constraints=factory(batch) if factory else None)
    return max(len(g.token_ids) for g in gens) / (time.process_time() - t0)


def _throughput(engine: TorchEngine, prompt: list[int], factory: Factory, batch: int,
                temperature: float, repeats: int) -> tuple[float, float]:
    """(plain, constrained) tokens per CPU-second of a batch, medians of alternating runs."""
    gens = engine.generate_constrained([prompt] * batch, 128, temperature, seed=0, constraints=factory(batch))
    steps = max(len(g.token_ids) for g in gens)
    plain, constrained = [], []
    for _ in range(repeats):
        plain.append(_rate(engine, prompt, batch, steps, None, temperature))
        constrained.append(_rate(engine, prompt, batch, steps, factory, temperature))
    return batch * statistics.median(plain), batch * statistics.median(constrained)


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


def check_call(text: str) -> dict[str, bool]:
    """Whether one generated call parses, validates against its tool's schema and keeps the canonical spacing."""
    import jsonschema

    out = {"parsed": False, "valid": False, "canonical": False}
    if not (text.startswith(GRAMMAR.begin) and text.endswith(GRAMMAR.end)):
        return out
    body_text = text[len(GRAMMAR.begin): len(text) - len(GRAMMAR.end)]
    try:
        body = json.loads(body_text)
    except json.JSONDecodeError:
        return out
    out["parsed"] = True
    schema = SCHEMAS.get(str(body.get("name"))) if isinstance(body, dict) else None
    if schema is not None and set(body) == {"name", "arguments"}:
        try:
            jsonschema.validate(body["arguments"], schema)
            out["valid"] = True
        except jsonschema.ValidationError:
            pass
    bare = _STRING.sub('""', body_text)  # whitespace outside strings must be exactly the separators' spaces
    out["canonical"] = not re.search(r"\s", re.sub(r"([,:]) ", r"\1", bare)) and not re.search(r"[,:](?! )", bare)
    return out


def _correctness(engine: TorchEngine, prompt: list[int], factory: Factory, samples: int) -> dict[str, int]:
    counts = {"calls": 0, "ended": 0, "parsed": 0, "valid": 0, "canonical": 0}
    for at in range(0, samples, 8):
        n = min(8, samples - at)
        for g in engine.generate_constrained([prompt] * n, 400, 1.0, seed=at, constraints=factory(n)):
            counts["calls"] += 1
            counts["ended"] += g.finish_reason == "stop"
            text = engine.tokenizer.decode(g.token_ids)
            for k, ok in check_call(text).items():
                counts[k] += ok
    return counts


def measure(candidate: Candidate, policy: Policy, samples: int, repeats: int) -> Figures:
    engine = TorchEngine(policy.model, policy.tokenizer)
    vocab = engine._vocab_size
    prompt = policy.tokenizer.encode(PROMPT if policy.kind == "smollm2" else "call a tool: ")
    t0 = time.perf_counter()
    data = candidate.prepare(policy, vocab)
    prepare_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    factory = candidate.compile(data, policy, vocab)
    factory(1)[0].fill_bitmask(np.zeros((vocab + 31) // 32, dtype=np.int32))
    compile_s = time.perf_counter() - t0
    temperature = 0.0 if policy.kind == "smollm2" else 1.0  # SmolLM2 greedy: a sensible call to time
    rates = {b: _throughput(engine, prompt, factory, b, temperature, repeats) for b in (1, 8)}
    correct = _correctness(engine, prompt, factory, samples) if policy.kind == "tiny" else {}
    return Figures(candidate.name, policy.kind, prepare_s, compile_s, rates, correct)


def _row(f: Figures) -> str:
    rates = " | ".join(f"{p:.0f} -> {c:.0f} ({c / p:.0%})" for p, c in (f.rates[1], f.rates[8]))
    ok = f.correct
    correct = (f"{ok['valid']}/{ok['calls']} valid, {ok['canonical']} canonical" if ok else "")
    return (f"| {f.library} | {f.model} | {f.prepare_s * 1000:.0f} | {f.compile_s * 1000:.1f} | {rates} | "
            f"{correct} |")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="tiny,smollm2")
    parser.add_argument("--libraries", default=",".join(c.name for c in CANDIDATES))
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print("| library | model | tokenizer prep ms | compile ms | batch 1 tokens/CPU-s plain -> constrained | "
          "batch 8 | tiny policy, T=1 |")
    print("|---|---|---|---|---|---|---|")
    for model in args.models.split(","):
        policy = build_policy(model)
        for candidate in CANDIDATES:
            if candidate.name not in args.libraries.split(","):
                continue
            try:
                print(_row(measure(candidate, policy, args.samples, args.repeats)), flush=True)
            except ImportError as exc:
                print(f"| {candidate.name} | {model} | not installed: {exc} |", flush=True)
            except Exception as exc:  # a library that cannot take the grammar is a finding, not a crash
                print(f"| {candidate.name} | {model} | failed: {type(exc).__name__}: {exc} |", flush=True)


if __name__ == "__main__":
    main()

