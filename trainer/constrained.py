"""Constrained decoding of forced tool calls: the grammar a call must follow, shared by the inference engines.

A ``ToolCallGrammar`` names the tools a call may use and how the calls are framed. ``tool_call_lark`` writes it
as one Lark grammar in llguidance's dialect (each tool's arguments an inline ``%json`` schema, whitespace fixed to
``json.dumps``'s separators). ``TorchEngine`` compiles that grammar with llguidance (``compile_tool_call_grammar``,
cached per tokenizer and grammar) and masks each step's logits to what it allows; ``VllmEngine`` sends the same
text as vLLM's ``structured_outputs.grammar``, which vLLM's guidance backend compiles with the same library.

llguidance was chosen by measurement against xgrammar, outlines and lm-format-enforcer:
docs/perf/constrained-decoding.md.
"""

from __future__ import annotations

import json
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from .tokenizer import Tokenizer, byte_level_decoding

# The JSON compiler's settings inside each %json block: no free whitespace, json.dumps's default separators.
CANONICAL_JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class ToolCallGrammar:
    """The text a forced tool call must be."""

    tools: tuple[tuple[str, str], ...]  # (function name, its parameters' JSON Schema as a JSON string); hashable
    begin: str  # text before each call, e.g. "<tool_call>\n" (Hermes) or "" (Llama 3 JSON)
    end: str  # text after each call, e.g. "\n</tool_call>"
    arguments_key: str = "arguments"  # Llama 3.x's JSON form uses "parameters"
    parallel: bool = False  # True: one or more calls, joined by "\n"; False: exactly one
    # Each call's body is the JSON object {"name": <one of the names>, "<arguments_key>": <object valid against
    # that tool's schema>}, in compact canonical JSON where the library lets the grammar fix whitespace
    # (separators ", " and ": " as json.dumps writes by default), then the model's end-of-sequence token.


# --- the grammar's text --------------------------------------------------------------------------------------


def tool_call_lark(grammar: ToolCallGrammar) -> str:
    """``grammar`` as a Lark grammar in llguidance's dialect (also what vLLM's guidance backend takes).

    Raises ValueError, with the reason, for a grammar no call can satisfy: no tools, a repeated or empty name, a
    schema that is not JSON or not an object schema."""
    if not grammar.tools:
        raise ValueError("a tool call grammar needs at least one tool")
    names = [name for name, _ in grammar.tools]
    if any(not isinstance(n, str) or not n for n in names):
        raise ValueError("every tool needs a non-empty name")
    if len(set(names)) != len(names):
        raise ValueError(f"tool names repeat: {sorted(n for n in set(names) if names.count(n) > 1)}")
    if not grammar.arguments_key:
        raise ValueError("arguments_key must not be empty")
    call = f"{_literal(grammar.begin)} body {_literal(grammar.end)}".strip()
    rules = [
        "start: call" + (' ("\\n" call)*' if grammar.parallel else ""),
        f"call: {call}",
        "body: " + " | ".join(f"body{i}" for i in range(len(grammar.tools))),
    ]
    for i, (name, schema) in enumerate(grammar.tools):
        head = "{" + json.dumps("name") + ": " + json.dumps(name) + ", " + json.dumps(grammar.arguments_key) + ": "
        rules.append(f'body{i}: {_literal(head)} args{i} "}}"')
        rules.append(f"args{i}: %json {json.dumps(_arguments_schema(name, schema))}")
    return "\n".join(rules) + "\n"


def _literal(text: str) -> str:
    """A Lark string literal for ``text`` (llguidance reads JSON's escapes); empty text is no symbol at all."""
    return json.dumps(text) if text else ""


def _arguments_schema(name: str, schema_json: str) -> dict[str, Any]:
    try:
        schema = json.loads(schema_json) if schema_json.strip() else {}
    except (json.JSONDecodeError, AttributeError) as exc:
        raise ValueError(f"tool {name!r}: its parameters are not a JSON Schema in JSON ({exc})") from None
    if not isinstance(schema, dict):
        raise ValueError(f"tool {name!r}: its parameters must be a JSON Schema object, not {type(schema).__name__}")
    kind = schema.get("type", "object")
    if kind != "object" and not (isinstance(kind, list) and "object" in kind):
        raise ValueError(f"tool {name!r}: its parameters must be an object schema, not type {kind!r}")
    return {**closed(schema), "type": "object", "x-guidance": CANONICAL_JSON}


def closed(schema: Any) -> Any:
    """``schema`` with every object that names its properties and says nothing of others closed to them
    (``additionalProperties: false``), at any depth, as vLLM's default grammar backend does (xgrammar's strict
    mode). JSON Schema leaves such objects open, and a forced call under an open schema may add keys until
    ``max_tokens`` cuts it (LangChain's and MCP's tool schemas are open by default). A call that validates
    against the closed schema validates against the original."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: closed(v) if k in _SUBSCHEMAS else v for k, v in schema.items()}
    for key in ("properties", "patternProperties", "$defs", "definitions"):
        if isinstance(out.get(key), dict):
            out[key] = {name: closed(sub) for name, sub in out[key].items()}
    if "properties" in out and "additionalProperties" not in out and "patternProperties" not in out:
        out["additionalProperties"] = False
    return out


_SUBSCHEMAS = frozenset({"items", "prefixItems", "anyOf", "oneOf", "allOf", "not", "if", "then", "else",
                         "additionalProperties", "contains"})


# --- compiling it for a tokenizer ----------------------------------------------------------------------------


class TokenConstraint(Protocol):
    """One sequence's grammar state, as the torch engine drives it (one per sequence of a batch)."""

    def fill_bitmask(self, row: np.ndarray[Any, Any]) -> None:
        """Write the allowed next tokens into ``row`` (int32 words, bit ``i % 32`` of word ``i // 32``)."""
        ...

    def accept(self, token: int) -> None:
        """Advance past ``token``, which the last mask allowed."""
        ...

    def is_finished(self) -> bool:
        """True once the grammar is complete and admits nothing more: end-of-sequence is then the only token."""
        ...


class _LlgConstraint:
    def __init__(self, matcher: Any) -> None:
        self.matcher = matcher

    def fill_bitmask(self, row: np.ndarray[Any, Any]) -> None:
        self.matcher.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
        self._check()

    def accept(self, token: int) -> None:
        if not self.matcher.consume_token(token):
            self._check()

    def is_finished(self) -> bool:
        return bool(self.matcher.is_stopped())

    def _check(self) -> None:
        if self.matcher.is_error():
            raise RuntimeError(f"constrained decoding failed: {self.matcher.get_error()}")


@dataclass
class CompiledToolCallGrammar:
    """A grammar (its Lark text) compiled for one tokenizer: ``start(n)`` gives ``n`` fresh sequence states."""

    lark: str
    vocab_size: int  # the width of the masks (the model's logits)
    eos_id: int
    _matcher: Any  # llguidance.LLMatcher in its start state; each sequence gets a copy
    compile_seconds: float = 0.0

    def start(self, n: int) -> list[TokenConstraint]:
        return [_LlgConstraint(self._matcher.deep_copy()) for _ in range(n)]


_CACHE_SIZE = 64  # distinct grammars kept compiled per tokenizer
_lock = threading.Lock()
_ll_tokenizers: weakref.WeakKeyDictionary[Any, dict[int, Any]] = weakref.WeakKeyDictionary()
_compiled: weakref.WeakKeyDictionary[Any, OrderedDict[tuple[int, str], CompiledToolCallGrammar]] = (
    weakref.WeakKeyDictionary())


def compile_tool_call_grammar(tokenizer: Tokenizer, grammar: ToolCallGrammar,
                              vocab_size: int | None = None) -> CompiledToolCallGrammar:
    """``grammar`` compiled with llguidance for ``tokenizer`` (masks ``vocab_size`` wide: the model's logits;
    default the tokenizer's size). Compiled once per (tokenizer, vocab size, grammar); later calls return the
    cached one. ValueError when llguidance rejects the grammar (e.g. a schema keyword it does not implement)."""
    try:
        return compile_lark(tokenizer, tool_call_lark(grammar), vocab_size)
    except _Rejected as exc:
        raise ValueError(_rejection(grammar, str(exc))) from None


class _Rejected(ValueError):
    pass


def compile_lark(tokenizer: Tokenizer, lark: str, vocab_size: int | None = None) -> CompiledToolCallGrammar:
    """A grammar's Lark text (``tool_call_lark``'s, as a span records it) compiled with llguidance for
    ``tokenizer``, cached as ``compile_tool_call_grammar``'s; ValueError when llguidance rejects it."""
    import time

    import llguidance

    vocab = int(vocab_size or tokenizer.vocab_size)
    key = (vocab, lark)
    with _lock:
        per_tok = _compiled.setdefault(tokenizer, OrderedDict())
        hit = per_tok.get(key)
        if hit is not None:
            per_tok.move_to_end(key)
            return hit
        ll_tok = _ll_tokenizer(tokenizer, vocab)
    t0 = time.perf_counter()
    text = llguidance.grammar_from("lark", lark)
    error = llguidance.LLMatcher.validate_grammar(text, ll_tok)
    if error:
        raise _Rejected(error)
    matcher = llguidance.LLMatcher(ll_tok, text, log_level=0)
    if matcher.is_error():
        raise _Rejected(matcher.get_error())
    compiled = CompiledToolCallGrammar(lark, vocab, tokenizer.eos_id, matcher, time.perf_counter() - t0)
    with _lock:
        per_tok[key] = compiled
        while len(per_tok) > _CACHE_SIZE:
            per_tok.popitem(last=False)
    return compiled


def _rejection(grammar: ToolCallGrammar, error: str) -> str:
    """Why llguidance refused ``grammar``, naming the first tool whose schema it refuses on its own."""
    import llguidance

    for name, schema in grammar.tools:
        own = llguidance.LLMatcher.grammar_from_json_schema(_arguments_schema(name, schema))
        alone = llguidance.LLMatcher.validate_grammar(own)
        if alone:
            return f"tool {name!r}: its parameters' schema cannot be enforced: {alone.splitlines()[0]}"
    return f"the tool call grammar cannot be enforced: {error.splitlines()[0]}"


def _ll_tokenizer(tokenizer: Tokenizer, vocab: int) -> Any:
    """llguidance's view of ``tokenizer`` (building it reads the whole vocabulary: ~1 s for 49k tokens), kept
    while the tokenizer lives. Called under ``_lock``."""
    import llguidance

    per_vocab = _ll_tokenizers.setdefault(tokenizer, {})
    if vocab not in per_vocab:
        to_hf = getattr(tokenizer, "to_hf", None)
        hf = to_hf() if callable(to_hf) else getattr(tokenizer, "tok", None)
        backend = getattr(hf, "backend_tokenizer", None)
        if backend is None:
            raise ValueError(f"constrained decoding needs a Hugging Face fast tokenizer, not {type(hf)}")
        per_vocab[vocab] = llguidance.LLTokenizer(byte_level_decoding(backend.to_str()), n_vocab=vocab,
                                                  eos_token=tokenizer.eos_id)
    return per_vocab[vocab]


# --- masks -----------------------------------------------------------------------------------------------------


def allowed_tokens(constraints: Sequence[TokenConstraint | None], vocab_size: int, eos_id: int) -> np.ndarray[Any, Any]:
    """The boolean mask ``[len(constraints), vocab_size]`` of the tokens each sequence may take next; a row whose
    constraint is None (a finished sequence) allows everything. A finished grammar allows end-of-sequence only."""
    words = (vocab_size + 31) // 32
    bits = np.full((len(constraints), words), -1, dtype=np.int32)
    for b, c in enumerate(constraints):
        if c is None:
            continue
        if c.is_finished():
            bits[b] = 0
            bits[b, eos_id // 32] = np.int32(np.uint32(1 << (eos_id % 32)).view(np.int32))
        else:
            c.fill_bitmask(bits[b])
    # Little-endian words: byte k of word j holds tokens 32j + 8k ... 32j + 8k + 7, lowest bit first.
    unpacked = np.unpackbits(bits.view(np.uint8), axis=1, bitorder="little")
    return unpacked[:, :vocab_size].astype(bool)


def replay_allowed(compiled: CompiledToolCallGrammar, tokens: Sequence[int]) -> np.ndarray[Any, Any]:
    """The boolean mask ``[len(tokens), vocab_size]`` each token of a constrained response was drawn under,
    recomputed by feeding the response through the grammar again (the masks depend on the grammar and the tokens
    before only). The torch engine's loop is replayed: end-of-sequence stops it. ValueError when a token is one the
    grammar did not allow (the response was not decoded under this grammar with this tokenizer)."""
    state = compiled.start(1)[0]
    rows = np.zeros((len(tokens), compiled.vocab_size), dtype=bool)
    for j, token in enumerate(tokens):
        rows[j] = allowed_tokens([state], compiled.vocab_size, compiled.eos_id)[0]
        if not 0 <= token < compiled.vocab_size or not rows[j, token]:
            raise ValueError(f"token {token} at position {j} is not one the grammar allowed there")
        if token == compiled.eos_id:
            rows[j + 1:] = True  # nothing follows end-of-sequence in a response; kept neutral
            break
        state.accept(token)
    return rows
