"""The compiled Avro codec against fastavro: the same bytes out, the same records and models back, for every
record type, on records generated from the schemas; and corrupt bytes are refused, never a crash."""

from __future__ import annotations

import io
import json
import math
from typing import Any

import fastavro
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from litstream.schemas import avro_fast
from litstream.schemas.codec import Codec, DecodeError, SchemaStore
from litstream.schemas.events import (
    BY_NAME,
    AttemptHeartbeat,
    AvroRolloutConfig,
    RolloutEnqueued,
    SpanRecorded,
)
from tests.samples import all_records

STORE = SchemaStore()
CODEC = Codec(store=STORE)
NAMES = sorted(BY_NAME)
PRIMITIVE_STRATEGIES: dict[str, st.SearchStrategy[Any]] = {
    "null": st.none(),
    "boolean": st.booleans(),
    "int": st.integers(-(2**31), 2**31 - 1),
    "long": st.integers(-(2**63), 2**63 - 1),
    "float": st.floats(width=32, allow_nan=False),
    "double": st.floats(allow_nan=False),
    "bytes": st.binary(max_size=20),
    "string": st.text(max_size=20),
}
JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                      max_size=3), max_leaves=6)


def test_the_extension_is_built() -> None:
    """The package builds it on install (pyproject's ext-modules); without it everything still works, slower."""
    assert avro_fast.available()
    assert set(CODEC._compiled) == set(BY_NAME)


def records(schema: Any, named: dict[str, Any], field: str = "") -> st.SearchStrategy[Any]:
    """Values of an Avro type, as fastavro's reader gives them; JSON fields (``*_json``) hold JSON text."""
    if isinstance(schema, str):
        if schema in PRIMITIVE_STRATEGIES:
            if field.endswith("_json") and schema == "string":
                return JSON_VALUES.map(lambda v: json.dumps(v, separators=(",", ":"), ensure_ascii=False))
            return PRIMITIVE_STRATEGIES[schema]
        return records(named[schema], named, field)
    if isinstance(schema, list):
        return st.one_of([records(b, named, field) for b in schema])
    kind = schema["type"]
    if "name" in schema:
        named.setdefault(schema["name"], schema)
    if kind in PRIMITIVE_STRATEGIES:
        return records(kind, named, field)
    if kind == "enum":
        return st.sampled_from(schema["symbols"])
    if kind == "array":
        return st.lists(records(schema["items"], named), max_size=4)
    if kind == "map":
        return st.dictionaries(st.text(max_size=8), records(schema["values"], named), max_size=4)
    assert kind == "record", kind
    return st.fixed_dictionaries({f["name"]: records(f["type"], named, f["name"]) for f in schema["fields"]})


def fastavro_bytes(name: str, record: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, STORE.readers[name], record)
    return buf.getvalue()


def fastavro_record(name: str, data: bytes) -> Any:
    return fastavro.schemaless_reader(io.BytesIO(data), STORE.readers[name], None)


def same(a: Any, b: Any) -> bool:
    """Equal, with -0.0 told from 0.0 (the bytes differ) and NaN equal to NaN (flipped bits make them)."""
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def strategy_of(name: str) -> st.SearchStrategy[Any]:
    parsed = STORE.readers[name]
    return records(parsed, dict(parsed.get("__named_schemas", {})))


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_records_encode_and_decode_as_fastavro_does(name: str, data: st.DataObject) -> None:
    record = data.draw(strategy_of(name))
    compiled = CODEC._compiled[name]
    expected = fastavro_bytes(name, record)
    assert compiled.encode(record, b"") == expected
    assert same(compiled.decode_record(expected, 0), fastavro_record(name, expected))


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_models_decode_and_encode_as_the_python_path_does(name: str, data: st.DataObject) -> None:
    """decode: the model ``from_record`` builds from fastavro's record; encode: fastavro's bytes of
    ``to_wire_record``, with a header in front."""
    cls = BY_NAME[name]
    body = fastavro_bytes(name, data.draw(strategy_of(name)))
    model = CODEC._compiled[name].decode_model(body, 0)
    expected = cls.from_record(fastavro_record(name, body))
    assert type(model) is cls
    assert same(model.__dict__, expected.__dict__) or model == expected
    assert model.model_fields_set == expected.model_fields_set
    assert model.model_dump(warnings=False) == expected.model_dump(warnings=False)
    assert CODEC._compiled[name].encode(model, b"HDR") == b"HDR" + fastavro_bytes(name, expected.to_wire_record())


@pytest.mark.parametrize("record", all_records(), ids=lambda r: type(r).__name__)
def test_sample_models_give_fastavros_bytes(record: Any) -> None:
    name = type(record).avro_name
    assert CODEC.encode(record)[10:] == fastavro_bytes(name, record.to_wire_record())
    assert CODEC.encode_record(name, record.to_record())[10:] == fastavro_bytes(name, record.to_record())


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_corrupt_bodies_are_refused_or_read_as_fastavro_reads_them(name: str, data: st.DataObject) -> None:
    """Truncated, bit-flipped or random bodies: the program raises AvroError, or reads what fastavro reads."""
    good = fastavro_bytes(name, data.draw(strategy_of(name)))
    how = data.draw(st.sampled_from(["truncate", "flip", "random", "append"]))
    if how == "truncate":
        body = good[: data.draw(st.integers(0, max(0, len(good) - 1)))]
    elif how == "flip" and good:
        i = data.draw(st.integers(0, len(good) - 1))
        body = good[:i] + bytes([good[i] ^ (1 << data.draw(st.integers(0, 7)))]) + good[i + 1:]
    elif how == "append":
        body = good + data.draw(st.binary(min_size=1, max_size=4))
    else:
        body = data.draw(st.binary(max_size=64))
    compiled = CODEC._compiled[name]
    try:
        got = compiled.decode_record(body, 0)
    except avro_fast.AvroError:
        return
    assert same(got, fastavro_record(name, body))


ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.lists(inner, max_size=3).map(tuple)
    | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    | st.dictionaries(st.integers(-5, 5) | st.booleans() | st.none(), inner, max_size=2),
    max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(value=ANY_JSON, metadata=st.dictionaries(st.text(max_size=6), ANY_JSON, max_size=3))
def test_json_fields_are_written_as_pythons_json_writes_them(value: Any, metadata: dict[str, Any]) -> None:
    """Control characters, quotes, non-ASCII, NaN and infinities, huge ints, tuples, non-str keys: the JSON text
    in the bytes is json.dumps's (the compiled writer's own, or json's where it hands over)."""
    record = RolloutEnqueued.model_construct(meta=all_span().meta, input=value, start_time=1.0, mode=None,
                                             resources_id=None, config=AvroRolloutConfig(), metadata=metadata,
                                             start_attempt_id=None, worker_id=None)
    name = RolloutEnqueued.avro_name
    assert CODEC.encode(record)[10:] == fastavro_bytes(name, record.to_wire_record())


def test_a_value_the_schema_cannot_hold_is_refused_with_the_field_named() -> None:
    span = SpanRecorded.model_validate({**all_span().model_dump()})
    record = span.to_record()
    record["sequence_id"] = "seven"
    with pytest.raises(TypeError, match="sequence_id: long value expected, got str"):
        CODEC.encode_record(SpanRecorded.avro_name, record)
    record = span.to_record()
    record["attributes"] = {"k": object()}
    with pytest.raises(ValueError, match="attributes: object .* is not of any type of the union"):
        CODEC.encode_record(SpanRecorded.avro_name, record)
    record = span.to_record()
    del record["attempt_id"]
    with pytest.raises(ValueError, match="no value for field attempt_id"):
        CODEC.encode_record(SpanRecorded.avro_name, record)


def test_missing_fields_with_defaults_take_them() -> None:
    record = AttemptHeartbeat.model_validate(
        {"meta": all_span().meta, "attempt_id": "a1", "time": 1.0}).to_record()
    del record["worker_id"]
    del record["max_sequence_id"]
    name = AttemptHeartbeat.avro_name
    assert CODEC.encode_record(name, record)[10:] == fastavro_bytes(name, record)


def test_corrupt_messages_are_decode_errors_naming_the_record() -> None:
    data = CODEC.encode(all_span())
    with pytest.raises(DecodeError, match="corrupt litstream.SpanRecorded body: .*"):
        CODEC.decode(data[:-3])
    with pytest.raises(DecodeError, match="trailing bytes"):
        CODEC.decode(data + b"\x00")


def all_span() -> SpanRecorded:
    return next(r for r in all_records() if isinstance(r, SpanRecorded))


def test_schemas_a_program_cannot_copy_exactly_are_left_to_fastavro() -> None:
    """A union of two records (fastavro picks by validating each) and logical types (fastavro converts values)."""
    from pydantic import BaseModel

    class T(BaseModel):
        x: Any

    class L(BaseModel):
        t: int

    two_records = {"type": "record", "name": "T", "fields": [{"name": "x", "type": [
        {"type": "record", "name": "A", "fields": [{"name": "a", "type": "long"}]},
        {"type": "record", "name": "B", "fields": [{"name": "b", "type": "string"}]}]}]}
    logical = {"type": "record", "name": "L", "fields": [
        {"name": "t", "type": {"type": "long", "logicalType": "timestamp-micros"}}]}
    for schema, model in ((two_records, T), (logical, L)):
        assert avro_fast.compile_record(fastavro.parse_schema(schema), model) is None
        plain = {**schema, "name": f"{schema['name']}2"}  # the same record without what a program cannot copy
        plain["fields"] = [{"name": f["name"], "type": "long"} for f in schema["fields"]]
        assert avro_fast.compile_record(fastavro.parse_schema(plain), model) is not None
