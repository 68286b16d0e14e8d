"""Models of values that are valid already, built without validating them again.

For models made from other validated models on a hot path: a rollout's snapshot from its folded state (whose
values all came from validated events), the reference's ``Rollout`` from a snapshot. Every field must be given;
the values are shared, as ``model_copy`` shares them.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel

M = TypeVar("M", bound=BaseModel)

# pydantic's slots, set directly: what model_construct does, without its per-field loop.
_set_dict = BaseModel.__dict__["__dict__"].__set__
_set_fields_set = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_set_extra = BaseModel.__dict__["__pydantic_extra__"].__set__
_set_private = BaseModel.__dict__["__pydantic_private__"].__set__


def assemble(cls: type[M], data: dict[str, Any], fields_set: set[str]) -> M:
    """A model of ``cls`` holding ``data`` (every field, in the model's order) as its fields, unchecked: the one
    place that fills pydantic's slots for the fast paths (decoding, :func:`trusted`, the fold's copies)."""
    obj = cls.__new__(cls)
    _set_dict(obj, data)
    _set_fields_set(obj, fields_set)
    _set_extra(obj, None)
    _set_private(obj, None)
    return obj

_NAMES: dict[type[BaseModel], tuple[tuple[str, ...], frozenset[str]]] = {}


def trusted(cls: type[M], fields: dict[str, Any]) -> M:
    """``cls(**fields)`` without validation; a missing or unknown field is a TypeError."""
    names = _NAMES.get(cls)
    if names is None:
        names = _NAMES[cls] = (tuple(cls.model_fields), frozenset(cls.model_fields))
    order, name_set = names
    if fields.keys() != name_set:
        raise TypeError(f"{cls.__name__}: every field is needed: missing {sorted(name_set - fields.keys())}, "
                        f"unknown {sorted(fields.keys() - name_set)}")
    return assemble(cls, {name: fields[name] for name in order}, set(name_set))  # the model's order, as validation
