"""The compiled Avro codec (``_avro``, a C extension built with the package): one program per record type.

fastavro walks its parsed schema for every record and the models need a Python pass each way (fields to a
record, a record to a model); together that held a span event to ~30k encodes/s. A program does all of it in
one C walk: encode reads a model's fields (or a record dict) and writes the Avro binary; decode builds the model
(or the record dict) straight from the bytes. Same bytes as fastavro, checked by tests/test_avro_fast.py.

A program is made only where it is exact: the reader's own schema (no resolution between versions), types the
extension knows, model fields that match the record's. Everywhere else, and when the extension was not built
(``available()`` is False), the codec keeps to fastavro.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from .events import _dumps, _nested

try:
    from . import _avro
except ImportError:  # built without a C compiler: fastavro does all the work
    _avro = None  # type: ignore[assignment]

PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
_MISSING = object()  # a field without an Avro default
_loads = json.JSONDecoder().decode  # json.loads without its per-call checks (the wire holds str)


def available() -> bool:
    """The extension was built, and this host stores floats as Avro does (little-endian)."""
    return _avro is not None and sys.byteorder == "little"


class Unsupported(Exception):
    """A schema (or a model) a program cannot cover exactly; the codec uses fastavro for it."""


class Compiled:
    """The programs of one record type: ``encode`` (a model or a record dict), ``decode_model``,
    ``decode_record`` (the record dict, JSON fields as text)."""

    def __init__(self, schema: dict[str, Any], cls: type[BaseModel]) -> None:
        named = dict(schema.get("__named_schemas", {}))
        model_program = _Compiler(named, models=True).node(schema, cls)
        record_program = _Compiler(named, models=False).node(schema, None)
        assert _avro is not None
        self._model = _avro.compile(model_program, _MISSING, _dumps, _loads)
        self._record = _avro.compile(record_program, _MISSING, _dumps, _loads)
        # The programs' own methods, no Python frame between them and the codec (one call per message).
        self.encode: Callable[[Any, bytes], bytes] = self._model.encode  # a model or a record dict, header
        self.decode_model: Callable[[bytes, int], Any] = self._model.decode  # data, offset of the body
        self.decode_record: Callable[[bytes, int], dict[str, Any]] = self._record.decode


def compile_record(schema: dict[str, Any], cls: type[BaseModel]) -> Compiled | None:
    """The programs for a parsed record schema and its model, or None where fastavro must do the work."""
    if not available():
        return None
    try:
        return Compiled(schema, cls)
    except Unsupported:
        return None


AvroError: type[ValueError] = _avro.AvroError if _avro is not None else ValueError


class _Compiler:
    """A parsed fastavro schema -> the nested tuples ``_avro.compile`` takes (see the comment above its
    compile_node). With ``models``, records that a model field holds decode to that model."""

    def __init__(self, named: dict[str, Any], models: bool) -> None:
        self.named = named
        self.models = models
        self.depth = 0

    def node(self, schema: Any, cls: type[BaseModel] | None) -> tuple[Any, ...]:
        self.depth += 1
        if self.depth > 32:
            raise Unsupported("recursive schema")
        try:
            return self._node(schema, cls)
        finally:
            self.depth -= 1

    def _node(self, schema: Any, cls: type[BaseModel] | None) -> tuple[Any, ...]:
        if isinstance(schema, str):
            if schema in PRIMITIVES:
                return (schema,)
            if schema not in self.named:
                raise Unsupported(f"unknown named type {schema}")
            return self.node(self.named[schema], cls)
        if isinstance(schema, list):
            branches = tuple(self.node(b, cls) for b in schema)
            if sum(b[0] in ("record", "map") for b in branches) > 1:
                # Both take a dict: fastavro tells them apart by validating the value against each in turn.
                raise Unsupported("a union of several records or maps")
            return ("union", branches, tuple(_branch_name(b) for b in schema))
        if not isinstance(schema, dict):
            raise Unsupported(f"schema {schema!r}")
        if "logicalType" in schema:
            raise Unsupported("logical types convert values; fastavro does that")
        kind = schema["type"]
        if kind in PRIMITIVES:
            return (kind,)
        if "name" in schema:
            self.named.setdefault(schema["name"], schema)
        if kind == "enum":
            return ("enum", tuple(schema["symbols"]))
        if kind == "array":
            return ("array", self.node(schema["items"], cls))
        if kind == "map":
            return ("map", self.node(schema["values"], cls))
        if kind == "record":
            return self._record(schema, cls if self.models else None)
        raise Unsupported(f"type {kind}")

    def _record(self, schema: dict[str, Any], cls: type[BaseModel] | None) -> tuple[Any, ...]:
        wire = [f["name"] for f in schema["fields"]]
        json_fields = frozenset(getattr(cls, "json_fields", ())) if cls is not None else frozenset()
        attrs = [n[:-5] if n.endswith("_json") and n[:-5] in json_fields else n for n in wire]
        if cls is not None and set(attrs) != set(cls.model_fields):
            raise Unsupported(f"{cls.__name__}'s fields are not its record's")
        fields = []
        for f, attr in zip(schema["fields"], attrs, strict=True):
            is_json = attr != f["name"]
            inner = None
            if cls is not None and not is_json:
                nested = _nested(cls.model_fields[attr].annotation)
                inner = nested.cls if nested is not None else None
            json_default = None
            if is_json and cls is not None:
                default = cls.model_fields[attr].get_default(call_default_factory=True)
                if _is_json_value(default):
                    json_default = _dumps(default)
            fields.append((f["name"], attr, self.node(f["type"], inner), is_json, f.get("default", _MISSING),
                           json_default))
        if cls is None:
            return ("record", None, None, tuple(fields), tuple(range(len(fields))))
        order = tuple(attrs.index(name) for name in cls.model_fields)  # the model's field order
        return ("record", cls, frozenset(cls.model_fields), tuple(fields), order)


def _is_json_value(value: Any) -> bool:
    try:
        _dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def _branch_name(schema: Any) -> str:
    """The name fastavro's tuple notation uses for a union branch."""
    if isinstance(schema, str):
        return schema
    if isinstance(schema, dict):
        return str(schema.get("name", schema.get("type")))
    return "?"


__all__ = ["AvroError", "Compiled", "available", "compile_record"]
