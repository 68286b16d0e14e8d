"""The Confluent wire format: ``00`` + schema id + body, with schema ids from a registry's REST API.

No schema registry server installs on this machine, so the test serves the two REST calls the codec makes
(register a schema under a subject, fetch a schema by id) on loopback, as the Confluent API defines them.
"""

from __future__ import annotations

import json
import struct
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from litstream.schemas.codec import Codec, DecodeError, SchemaRegistryClient
from tests.samples import all_records


@pytest.fixture
def registry() -> Iterator[tuple[str, dict[str, Any]]]:
    state: dict[str, Any] = {"schemas": {}, "subjects": {}}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _json(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:  # noqa: N802
            subject = self.path.split("/")[2]
            schema = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["schema"]
            ids = {v: k for k, v in state["schemas"].items()}
            sid = ids.get(schema) or len(state["schemas"]) + 1
            state["schemas"][sid] = schema
            state["subjects"].setdefault(subject, []).append(sid)
            self._json(200, {"id": sid})

        def do_GET(self) -> None:  # noqa: N802
            sid = int(self.path.rsplit("/", 1)[1])
            if sid not in state["schemas"]:
                self._json(404, {"error_code": 40403, "message": "Schema not found"})
                return
            self._json(200, {"schema": state["schemas"][sid]})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", state
    server.shutdown()


def test_round_trip_through_registry(registry: tuple[str, dict[str, Any]]) -> None:
    url, state = registry
    writer = Codec(registry=SchemaRegistryClient(url))
    reader = Codec(registry=SchemaRegistryClient(url))  # another process: learns schemas by id
    for record in all_records():
        data = writer.encode(record)
        assert data[0] == 0
        (sid,) = struct.unpack(">I", data[1:5])
        assert reader.decode(data) == record
        assert sid in state["subjects"][type(record).avro_name]  # type: ignore[attr-defined]


def test_unknown_schema_id_is_a_decode_error(registry: tuple[str, dict[str, Any]]) -> None:
    url, _ = registry
    with pytest.raises(DecodeError, match="schema id 999"):
        Codec(registry=SchemaRegistryClient(url)).decode(b"\x00" + struct.pack(">I", 999) + b"\x02")


def test_single_object_messages_still_decode_with_a_registry(registry: tuple[str, dict[str, Any]]) -> None:
    url, _ = registry
    record = all_records()[0]
    assert Codec(registry=SchemaRegistryClient(url)).decode(Codec().encode(record)) == record
