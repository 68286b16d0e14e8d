"""The Avro codec: round trips, schema evolution both ways, and clear errors on bad bytes."""

from __future__ import annotations

import copy
import io
import json
from typing import Any

import fastavro
import pytest
from fastavro.schema import load_schema
from pydantic import BaseModel

from litstream.schemas.codec import AVRO_DIR, Codec, DecodeError, SchemaStore, fingerprint, rabin_fingerprint
from litstream.schemas.events import BY_NAME, AvroModel, EventFactory, RolloutEnqueued
from tests.samples import RID, F, all_records


@pytest.mark.parametrize("record", all_records(), ids=lambda r: type(r).__name__)
def test_round_trip(record: AvroModel) -> None:
    codec = Codec()
    data = codec.encode(record)
    assert data[:2] == b"\xc3\x01"
    assert codec.decode(data) == record


def test_every_record_type_is_covered() -> None:
    assert {type(r).avro_name for r in all_records()} == set(BY_NAME)  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_models_match_avro_schemas(name: str) -> None:
    """The .avsc files are the source of truth: every model field maps to one Avro field and back."""
    schema = load_schema(str(AVRO_DIR / f"{name}.avsc"), _write_hint=False)
    avro_fields = {f["name"] for f in schema["fields"]}
    cls = BY_NAME[name]
    model_fields = {f"{n}_json" if n in cls.json_fields else n for n in cls.model_fields}
    assert model_fields == avro_fields


def test_fingerprint_is_the_avro_crc64() -> None:
    """Single-object encoding's header: the CRC-64-AVRO of the canonical form, little-endian."""
    assert rabin_fingerprint(b'"int"') == 0x7275D51A3F395C8F  # the Avro specification's test vector
    for name, parsed in SchemaStore().readers.items():
        canonical = fastavro.schema.to_parsing_canonical_form(parsed)
        assert fingerprint(parsed).hex() == fastavro.schema.fingerprint(canonical, "CRC-64-AVRO"), name


def test_a_record_this_code_wrote_decodes_with_its_reader_schema_as_the_writer() -> None:
    """An earlier version with this code's canonical form (unchanged since, or changed only in docs or defaults)
    shares its fingerprint; the store keeps this code's schema for it, so such records decode without resolving
    one schema against another (which took the decode of a rollout snapshot from ~19 to ~34 µs)."""
    store = SchemaStore()
    for name, reader in store.readers.items():
        assert store.writer(store.reader_fp[name]) is reader, name


@pytest.mark.parametrize("record", [r for r in all_records()
                                    if (AVRO_DIR / "v1" / f"{type(r).avro_name}.avsc").exists()],  # type: ignore[attr-defined]
                         ids=lambda r: type(r).__name__)
def test_events_written_before_runs_were_recorded_still_decode(record: AvroModel) -> None:
    """Bytes as the first version of the schemas wrote them (no run id) decode to this code's models."""
    name = type(record).avro_name  # type: ignore[attr-defined]
    v1 = Codec(writers={name: load_schema(str(AVRO_DIR / "v1" / f"{name}.avsc"), _write_hint=False)})
    if hasattr(record, "meta"):
        record = record.model_copy(update={"meta": record.meta.model_copy(update={"run_id": None})})
    data = v1.encode(record)
    assert Codec().decode(data) == record


def test_a_run_id_travels_with_every_rollout_scoped_event() -> None:
    f = EventFactory(role="test", run_id="run-20261129T020000Z-abc123")
    event = RolloutEnqueued(meta=f.meta(RID), input=1, start_time=1.0)
    assert Codec().decode(Codec().encode(event)).meta.run_id == "run-20261129T020000Z-abc123"  # type: ignore[attr-defined]
    assert f.meta_record(RID)["run_id"] == "run-20261129T020000Z-abc123"


def _v2_schema() -> dict:
    """RolloutEnqueued as a newer writer would have it: one more field, with a default."""
    schema = copy.deepcopy(load_schema(str(AVRO_DIR / "litstream.RolloutEnqueued.avsc"), _write_hint=False))
    schema["fields"].append({"name": "priority", "type": "int", "default": 0})
    return schema


SAMPLE = RolloutEnqueued(meta=F.meta(RID), input={"q": 2}, start_time=1.0)


def _sample() -> RolloutEnqueued:
    return SAMPLE


def test_older_reader_reads_newer_writer() -> None:
    newer = Codec(writers={"litstream.RolloutEnqueued": _v2_schema()})
    older = Codec(store=newer.store)  # reads with this code's (v1) schema; knows v2 by fingerprint
    data = newer.encode(_sample())
    assert data[2:10] != older.store.reader_fp["litstream.RolloutEnqueued"]
    assert older.decode(data) == _sample()


def test_newer_reader_reads_older_writer() -> None:
    """A v2 reader resolves a v1 message: the added field takes its default."""
    older = Codec()
    data = older.encode(_sample())
    writer = older.store.writer(data[2:10])
    rec = fastavro.schemaless_reader(io.BytesIO(data[10:]), writer, fastavro.parse_schema(_v2_schema()))
    assert rec["priority"] == 0
    assert rec["meta"]["event_id"] == _sample().meta.event_id


@pytest.mark.parametrize("data, message", [
    (b"", "empty"),
    (b"\xc3\x01\x00\x00\x00\x00\x00\x00\x00\x00body", "unknown schema fingerprint"),
    (b"\xc3\x01\x01", "truncated"),
    (b'{"json": true}', "not a litstream Avro message"),
    (b"\x00\x00\x00\x00\x01rest", "no schema registry"),
])
def test_bad_bytes_are_decode_errors(data: bytes, message: str) -> None:
    with pytest.raises(DecodeError, match=message):
        Codec().decode(data)


def test_corrupt_body_is_a_decode_error() -> None:
    codec = Codec()
    good = codec.encode(all_records()[5])
    for cut in (11, len(good) // 2, len(good) - 1):
        with pytest.raises(DecodeError):
            codec.decode(good[:cut])
    with pytest.raises(DecodeError, match="trailing"):
        codec.decode(good + b"\x00\x00")


def test_invalid_values_rejected_at_construction() -> None:
    with pytest.raises(ValueError, match="JSON-serialisable"):
        RolloutEnqueued(meta=F.meta(RID), input={"x": object()}, start_time=1.0)
    with pytest.raises(ValueError):
        RolloutEnqueued(meta=F.meta(RID), input=1, start_time=1.0, mode="bogus")  # type: ignore[arg-type]


def test_decode_as_checks_the_type() -> None:
    codec = Codec()
    data = codec.encode(_sample())
    from litstream.schemas.events import SpanRecorded
    with pytest.raises(DecodeError, match="expected SpanRecorded"):
        codec.decode_as(data, SpanRecorded)


def test_schemas_are_valid_json_files() -> None:
    for path in AVRO_DIR.glob("*.avsc"):
        json.loads(path.read_text())


# --- the hot paths: no validation round trip, the same models and records --------------------------------------


@pytest.mark.parametrize("record", all_records(), ids=lambda r: type(r).__name__)
def test_decoded_models_are_whole(record: AvroModel) -> None:
    """A decoded model is built without validation, yet is the same model: fields, set fields, dumps, and it
    validates again as it is."""
    decoded = Codec().decode(Codec().encode(record))
    assert type(decoded) is type(record)
    assert decoded.model_dump() == record.model_dump()
    assert decoded.model_dump_json() == record.model_dump_json()
    assert decoded.model_fields_set == set(type(record).model_fields)
    assert type(record).model_validate(decoded.model_dump()) == record


@pytest.mark.parametrize("record", all_records(), ids=lambda r: type(r).__name__)
def test_to_record_is_the_avro_record(record: AvroModel) -> None:
    """The compiled dump gives what the schema takes: every JSON field a string, however deep."""
    rec = record.to_record()
    assert fastavro.validation.validate(rec, Codec().store.readers[type(record).avro_name])  # type: ignore[attr-defined]
    for name in record.json_fields:
        assert rec[f"{name}_json"] == json.dumps(getattr(record, name), separators=(",", ":"), ensure_ascii=False)


def _dumped_record(model: BaseModel) -> dict[str, Any]:
    """The Avro record by way of pydantic's model_dump: nested models as dicts, JSON fields as strings."""
    data = model.model_dump()

    def fix(m: BaseModel, d: dict[str, Any]) -> None:
        for name in getattr(m, "json_fields", ()):
            d[f"{name}_json"] = json.dumps(d.pop(name), separators=(",", ":"), ensure_ascii=False)
        for name in type(m).model_fields:
            value = getattr(m, name)
            items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
            for key, item in ([(None, value)] if isinstance(value, BaseModel) else items):
                if isinstance(item, BaseModel):
                    fix(item, d[name] if key is None else d[name][key])

    fix(model, data)
    return data


@pytest.mark.parametrize("record", all_records(), ids=lambda r: type(r).__name__)
def test_to_record_reads_the_fields_as_model_dump_would(record: AvroModel) -> None:
    """to_record reads the model's fields directly (not through model_dump): the very same record."""
    assert record.to_record() == _dumped_record(record)


def test_a_json_field_that_is_not_json_is_a_decode_error() -> None:
    codec = Codec()
    schema = codec.store.readers["litstream.RolloutEnqueued"]
    rec = SAMPLE.to_record()
    rec["input_json"] = "{not json"
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, schema, rec)
    data = b"\xc3\x01" + codec.store.reader_fp["litstream.RolloutEnqueued"] + buf.getvalue()
    with pytest.raises(DecodeError, match="invalid litstream.RolloutEnqueued"):
        codec.decode(data)


def _with_input_json(raw: str) -> bytes:
    """A RolloutEnqueued as another producer may write it: its input field's JSON exactly as given."""
    codec = Codec()
    rec = SAMPLE.to_record()
    rec["input_json"] = raw
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, codec.store.readers["litstream.RolloutEnqueued"], rec)
    return b"\xc3\x01" + codec.store.reader_fp["litstream.RolloutEnqueued"] + buf.getvalue()


@pytest.mark.parametrize("raw", [
    '{"n": 123456789012345678901234567890, "x": -0.0, "e": 1E5, "tiny": 2.5e-7}',
    '{"q": "caf\\u00e9 \\ud83d\\ude00 \\n", "dup": 1, "dup": 2}',
    '[NaN, Infinity, -Infinity, 1e400]',
    ' {"spaced" : [ true , false , null ] } ',
])
def test_json_fields_of_other_writers_decode_as_pythons_parser_reads_them(raw: str) -> None:
    """A JSON field is parsed by pydantic-core's parser: what Python's ``json`` reads from the same text (big
    integers, escapes, the non-finite numbers Python writes), value for value."""
    got = Codec().decode_as(_with_input_json(raw), RolloutEnqueued).input
    assert json.dumps(got) == json.dumps(json.loads(raw))


def test_decode_record_gives_the_avro_record_of_the_expected_type() -> None:
    from litstream.schemas.events import SpanRecorded
    from tests.samples import span

    codec = Codec()
    s = span()
    assert codec.decode_record(codec.encode(s), SpanRecorded) == s.to_record()
    with pytest.raises(DecodeError, match="expected SpanRecorded"):
        codec.decode_record(codec.encode(SAMPLE), SpanRecorded)


@pytest.mark.parametrize("record", all_records(),
                         ids=lambda r: type(r).__name__)
def test_tagged_attributes_write_the_same_bytes(record: AvroModel) -> None:
    """Attribute values tagged with their union branch (the encoder's fast path) give the very same bytes."""
    schema = Codec().store.readers[type(record).avro_name]  # type: ignore[attr-defined]
    plain, tagged = io.BytesIO(), io.BytesIO()
    fastavro.schemaless_writer(plain, schema, record.to_record())
    fastavro.schemaless_writer(tagged, schema, record.to_wire_record())
    assert plain.getvalue() == tagged.getvalue()


@pytest.mark.parametrize("record", all_records(), ids=lambda r: type(r).__name__)
def test_a_record_built_without_a_model_encodes_to_the_models_bytes_on_both_writers(record: AvroModel) -> None:
    """encode_record takes plain attribute values: fastavro's path tags each union branch by the value's type
    first, leaving the caller's record as it was."""
    codec, other = Codec(), Codec()
    name = type(record).avro_name  # type: ignore[attr-defined]
    plain = record.to_record()
    before = repr(plain)
    assert codec.encode_record(name, plain) == codec.encode(record)
    assert other.encode_record(name, plain) == codec.encode(record)
    assert repr(plain) == before


def test_every_attribute_type_round_trips_through_the_tagged_writer() -> None:
    from litstream.schemas.events import ResourceRecord, SpanEventRecord, SpanRecorded

    attrs = {"s": "x", "b": True, "f": False, "i": -3, "big": 2**62, "d": 0.5, "n": None, "l": [1, "a", None, 2.5, True]}
    s = SpanRecorded(meta=F.meta(RID), attempt_id="at-1", sequence_id=1, trace_id="ab" * 16, span_id="cd" * 8,
                     name="chat", start_time_ns=1, attributes=attrs,
                     events=[SpanEventRecord(name="e", attributes=attrs)], resource=ResourceRecord(attributes=attrs))
    decoded = Codec().decode(Codec().encode(s))
    assert decoded == s
    assert type(decoded.attributes["b"]) is bool and type(decoded.attributes["i"]) is int  # type: ignore[attr-defined]


def test_rebuilt_models_equal_validated_ones() -> None:
    """``rebuilt`` builds what validation builds from valid values (a snapshot from its folded state), through
    pydantic's own validation: a missing or unknown field is refused, and a JSON field that is not JSON is taken
    (it came from a validated model), while the model's own constructor refuses it."""
    from pydantic import ValidationError

    from litstream.schemas.events import RolloutSnapshot

    for record in all_records():
        fields = dict(record.__dict__)
        made = type(record).rebuilt(**fields)
        assert made == record
        assert list(made.__dict__) == list(record.__dict__)
    snapshot = next(r for r in all_records() if isinstance(r, RolloutSnapshot))
    fields = dict(snapshot.__dict__)
    del fields["version"]
    with pytest.raises(ValidationError, match="version"):
        RolloutSnapshot.rebuilt(**fields)
    with pytest.raises(ValidationError, match="colour"):
        RolloutSnapshot.rebuilt(**snapshot.__dict__, colour="red")
    odd = {**snapshot.__dict__, "input": {1, 2}}
    assert RolloutSnapshot.rebuilt(**odd).input == {1, 2}
    with pytest.raises(ValidationError, match="field 'input' must be JSON-serialisable"):
        RolloutSnapshot(**odd)
