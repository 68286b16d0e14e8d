"""Avro codec for every record the pipeline carries.

Two framings:
* **single-object encoding** (Avro spec): ``C3 01`` + 8-byte little-endian CRC-64-AVRO fingerprint of the writer
  schema + the binary body. No registry needed: the reader finds the writer schema by fingerprint in its
  :class:`SchemaStore` (every schema this code ships, plus any registered older or newer version).
* **Confluent wire format** when a schema registry URL is configured: ``00`` + 4-byte big-endian schema id + body.

Decoding never crashes on bad bytes: it raises :class:`DecodeError` with the reason, for the caller's dead letter.
"""

from __future__ import annotations

import io
import json
import struct
import threading
import urllib.request
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import fastavro
from fastavro.schema import load_schema, to_parsing_canonical_form
from pydantic import ValidationError

from .events import BY_NAME, AvroModel, tagged_record

AVRO_DIR = Path(__file__).parent / "avro"
SINGLE_OBJECT_MAGIC = b"\xc3\x01"
CONFLUENT_MAGIC = 0
M = TypeVar("M", bound=AvroModel)


class DecodeError(ValueError):
    """A message that cannot be decoded into a known record; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# CRC-64-AVRO (Rabin) as defined by the Avro specification's single-object encoding.
_EMPTY = 0xC15D213AA4D7A795
_TABLE: list[int] = []
for _i in range(256):
    _fp = _i
    for _ in range(8):
        _fp = (_fp >> 1) ^ (_EMPTY & -(_fp & 1))
    _TABLE.append(_fp)


def rabin_fingerprint(data: bytes) -> int:
    fp = _EMPTY
    for b in data:
        fp = (fp >> 8) ^ _TABLE[(fp ^ b) & 0xFF]
    return fp


def fingerprint(parsed_schema: Any) -> bytes:
    """The 8-byte little-endian fingerprint of a schema's parsing canonical form."""
    return rabin_fingerprint(to_parsing_canonical_form(parsed_schema).encode()).to_bytes(8, "little")


def _name_of(parsed: Any) -> str:
    return parsed["name"] if isinstance(parsed, dict) else ""


class SchemaStore:
    """Writer schemas by fingerprint, and the reader schema (this code's version) of every record name.

    Earlier versions of the schemas (``avro/v1/``, ...) are registered as writers too, so events written before a
    schema evolved still decode: fastavro resolves them to this code's version (a new field takes its default)."""

    def __init__(self, directory: Path = AVRO_DIR) -> None:
        self._by_fp: dict[bytes, Any] = {}
        self.readers: dict[str, Any] = {}
        self.reader_fp: dict[str, bytes] = {}
        for name in BY_NAME:
            parsed = fastavro.parse_schema(load_schema(str(directory / f"{name}.avsc"), _write_hint=False))
            self.readers[name] = parsed
            self.reader_fp[name] = self.register(parsed)
        for earlier in sorted(p for p in directory.glob("v*") if p.is_dir()):
            for name in BY_NAME:
                if (earlier / f"{name}.avsc").exists():
                    self.register(load_schema(str(earlier / f"{name}.avsc"), _write_hint=False))

    def register(self, schema: Any) -> bytes:
        """Add a writer schema (e.g. an older or newer version of a record); returns its fingerprint."""
        parsed = schema if isinstance(schema, dict) and "__fastavro_parsed" in schema else fastavro.parse_schema(schema)
        fp = fingerprint(parsed)
        # A canonical form already known (an earlier version left unchanged, or changed only in docs or defaults)
        # keeps the schema registered first: this code's reader, so such records decode without resolution.
        self._by_fp.setdefault(fp, parsed)
        return fp

    def writer(self, fp: bytes) -> Any | None:
        return self._by_fp.get(fp)


class SchemaRegistryClient:
    """The two calls of the Confluent Schema Registry REST API the codec needs, cached.

    Subjects follow the record-name strategy (one subject per record type), since a topic carries several types.
    """

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._ids: dict[str, int] = {}
        self._schemas: dict[int, Any] = {}
        self._lock = threading.Lock()

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/vnd.schemaregistry.v1+json"})
        with urllib.request.urlopen(req, timeout=self.timeout) as resp:  # noqa: S310 (configured URL)
            return json.loads(resp.read())

    def register(self, subject: str, canonical: str) -> int:
        with self._lock:
            if subject not in self._ids:
                self._ids[subject] = int(self._call("POST", f"/subjects/{subject}/versions", {"schema": canonical})["id"])
            return self._ids[subject]

    def schema(self, schema_id: int) -> Any:
        with self._lock:
            if schema_id not in self._schemas:
                raw = self._call("GET", f"/schemas/ids/{schema_id}")["schema"]
                self._schemas[schema_id] = fastavro.parse_schema(json.loads(raw))
            return self._schemas[schema_id]


class _Known(NamedTuple):
    """How to read a message whose header names a known writer schema."""

    writer: Any
    name: str
    cls: type[AvroModel]
    reader: Any  # None: the writer's schema is this code's
    offset: int  # where the body starts


class Codec:
    """Encode records to bytes and back."""

    def __init__(self, store: SchemaStore | None = None, registry: SchemaRegistryClient | None = None,
                 readers: dict[str, Any] | None = None, writers: dict[str, Any] | None = None) -> None:
        self.store = store or _default_store()
        self.registry = registry
        # Overrides let a codec read or write another version of a record (schema evolution, tests).
        self._readers = {**self.store.readers, **{k: fastavro.parse_schema(v) for k, v in (readers or {}).items()}}
        # Single-object headers read so far: the writer, the record, and the reader schema when it differs.
        self._headers: dict[bytes, _Known] = {}
        # Per record name: the writer schema and the single-object header (magic + its fingerprint).
        self._writers: dict[str, tuple[Any, bytes]] = {}
        for name, parsed in self.store.readers.items():
            self._writers[name] = (parsed, SINGLE_OBJECT_MAGIC + self.store.reader_fp[name])
        for name, schema in (writers or {}).items():
            fp = self.store.register(schema)
            self._writers[name] = (self.store.writer(fp), SINGLE_OBJECT_MAGIC + fp)

    # -- encoding --
    def encode(self, record: AvroModel) -> bytes:
        name: str = type(record).avro_name  # type: ignore[attr-defined]
        return self._write(name, record.to_wire_record())

    def writer_schema(self, name: str) -> Any:
        """The parsed schema this codec writes records of type ``name`` with."""
        return self._writers[name][0]

    def _header(self, name: str) -> bytes:
        if self.registry is not None:
            schema_id = self.registry.register(name, to_parsing_canonical_form(self._writers[name][0]))
            return struct.pack(">bI", CONFLUENT_MAGIC, schema_id)
        return self._writers[name][1]

    def encode_record(self, name: str, record: dict[str, Any]) -> bytes:
        """Encode an Avro record of type ``name`` that was built directly, without a model: for producers whose
        input is already typed (the OTel exporter's spans, OTLP). Attribute values are plain (each union branch is
        found by the value's type). The builder owns the checks a model would make; the writer still refuses a
        value its schema type cannot hold."""
        cls = BY_NAME.get(name)
        return self._write(name, tagged_record(cls, record) if cls is not None else record)

    def _write(self, name: str, record: dict[str, Any]) -> bytes:
        """fastavro's writer (attribute values tagged: it spares the writer trying each branch of the union)."""
        schema, header = self._writers[name]
        buf = io.BytesIO()
        buf.write(header if self.registry is None else self._header(name))
        fastavro.schemaless_writer(buf, schema, record)
        return buf.getvalue()

    # -- decoding --
    def _writer_schema(self, data: bytes) -> tuple[Any, int]:
        if data[:2] == SINGLE_OBJECT_MAGIC:
            if len(data) < 10:
                raise DecodeError(f"truncated single-object header ({len(data)} bytes)")
            writer = self.store.writer(data[2:10])
            if writer is None:
                raise DecodeError(
                    f"unknown schema fingerprint {data[2:10].hex()}: written by a schema this reader does not know "
                    "(register it, or upgrade this process)"
                )
            return writer, 10
        if data[:1] == b"\x00" and len(data) >= 5:
            if self.registry is None:
                raise DecodeError("Confluent wire-format message but no schema registry is configured "
                                  "(set LITSTREAM_SCHEMA_REGISTRY_URL)")
            (schema_id,) = struct.unpack(">I", data[1:5])
            try:
                return self.registry.schema(schema_id), 5
            except Exception as exc:  # network or registry error: still a decode failure for this message
                raise DecodeError(f"schema id {schema_id} not found in the registry: {exc}") from None
        raise DecodeError(f"not a litstream Avro message (first bytes {data[:4].hex() or 'empty'})")

    def decode(self, data: bytes | None) -> AvroModel:
        """The model of a message: fastavro's record, made a model without validating again (``from_record``:
        every producer validated the model it wrote)."""
        cls, name, rec = self._read(data)
        try:
            return cls.from_record(rec)
        except ValidationError as exc:
            raise DecodeError(f"invalid {name}: {_first_error(exc)}") from None
        except (ValueError, TypeError, KeyError, AttributeError) as exc:  # e.g. a JSON field that is not JSON
            raise DecodeError(f"invalid {name}: {type(exc).__name__}: {exc}") from None

    def decode_record(self, data: bytes | None, cls: type[AvroModel]) -> dict[str, Any]:
        """The Avro record itself (a dict, JSON fields still strings), no model: for consumers that only move
        the data on (the sink's columns), where building models would be most of the work."""
        got, name, rec = self._read(data)
        if got is not cls:
            raise DecodeError(f"expected {cls.__name__}, got {got.__name__}")
        return rec

    def _read(self, data: bytes | None) -> tuple[type[AvroModel], str, dict[str, Any]]:
        if not data:
            raise DecodeError("empty message")
        known = self._headers.get(data[:10])
        if known is None:
            known = self._resolve(data)
        writer, name, cls, reader, offset = known
        body = io.BytesIO(data)  # read from past the header: no copy of the body
        body.seek(offset)
        try:
            rec = fastavro.schemaless_reader(body, writer, reader)
        except Exception as exc:  # fastavro raises several types on corrupt input
            raise DecodeError(f"corrupt {name} body: {type(exc).__name__}: {exc}") from None
        if body.tell() != len(data):
            raise DecodeError(f"corrupt {name} body: {len(data) - body.tell()} trailing bytes")
        if not isinstance(rec, dict):
            raise DecodeError(f"corrupt {name} body: not a record")
        return cls, name, rec

    def _resolve(self, data: bytes) -> _Known:
        """Who wrote ``data`` and how to read it; a single-object header is remembered (it names one schema)."""
        writer, offset = self._writer_schema(data)
        name = _name_of(writer)
        cls = BY_NAME.get(name)
        if cls is None:
            raise DecodeError(f"record type {name!r} is not one litstream reads")
        reader = self._readers[name]
        known = _Known(writer, name, cls, None if reader is writer else reader, offset)
        if offset == 10:
            self._headers[data[:10]] = known
        return known

    def decode_as(self, data: bytes | None, cls: type[M]) -> M:
        record = self.decode(data)
        if not isinstance(record, cls):
            raise DecodeError(f"expected {cls.__name__}, got {type(record).__name__}")
        return record


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"]) or "(record)"
    return f"{loc}: {err['msg']}"


_STORE: SchemaStore | None = None


def _default_store() -> SchemaStore:
    global _STORE
    if _STORE is None:
        _STORE = SchemaStore()
    return _STORE


def default_codec(schema_registry_url: str | None = None) -> Codec:
    return Codec(registry=SchemaRegistryClient(schema_registry_url) if schema_registry_url else None)
