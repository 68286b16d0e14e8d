"""Constrained decoding of forced tool calls: the grammar a call must follow, shared by the inference engines.

A ``ToolCallGrammar`` names the tools a call may use and how the calls are framed. ``TorchEngine`` masks each
step's logits to what the grammar allows; ``VllmEngine`` sends the same grammar to the vLLM server as a
structured-output request.
"""

from __future__ import annotations

from dataclasses import dataclass


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
