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
set_dict = BaseModel.__dict__["__dict__"].__set__
set_fields_set = BaseModel.__dict__["__pydantic_fields_set__"].__set__
set_extra = BaseModel.__dict__["__pydantic_extra__"].__set__
set_private = BaseModel.__dict__["__pydantic_private__"].__set__

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
    obj = cls.__new__(cls)
    set_dict(obj, {name: fields[name] for name in order})  # the model's field order, as validation gives
    set_fields_set(obj, set(name_set))
    set_extra(obj, None)
    set_private(obj, None)
    return obj
