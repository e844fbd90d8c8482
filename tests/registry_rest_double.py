"""A test double of the Schema Registry's REST API (the few reads kmq's previews make), served
over real HTTP on a free loopback port, so confluent-kafka's ``SchemaRegistryClient`` talks to it
as to a real registry. Not a registry: schemas are put in by the test.

It answers as Confluent's registry does: ``GET /schemas/ids/{id}`` with the schema as text
(a Protobuf schema as ``.proto`` text unless ``?format=serialized`` asks for a base64
``FileDescriptorProto``), ``GET /schemas/ids/{id}/versions`` with its subject-version pairs, and
404 with error code 40403 for an unknown id. ``failing_with`` makes every answer that status.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from kmq_dagster.broker.ports import free_port


@dataclass
class StoredSchema:
    schema_type: str
    text: str
    subject: str
    version: int
    #: The Protobuf schema as base64 ``FileDescriptorProto`` (``format=serialized``).
    serialized: str | None = None


@dataclass
class RegistryDouble:
    url: str
    schemas: dict[int, StoredSchema] = field(default_factory=dict)
    #: Every request's path and query, in order.
    requests: list[str] = field(default_factory=list)
    failing_with: int | None = None


@contextmanager
def running_registry() -> Iterator[RegistryDouble]:
    """A registry double on a free port, stopped on exit."""
    port = free_port()
    double = RegistryDouble(url=f"http://127.0.0.1:{port}")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            double.requests.append(self.path)
            status, body = answer(double, self.path)
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield double
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def answer(double: RegistryDouble, path: str) -> tuple[int, Any]:
    if double.failing_with is not None:
        return double.failing_with, {"error_code": double.failing_with, "message": "failing"}
    parsed = urlparse(path)
    found = re.fullmatch(r"/schemas/ids/(\d+)(/versions)?", parsed.path)
    schema = double.schemas.get(int(found[1])) if found else None
    if found is None or schema is None:
        return 404, {"error_code": 40403, "message": "Schema not found"}
    if found[2]:
        return 200, [{"subject": schema.subject, "version": schema.version}]
    serialized = parse_qs(parsed.query).get("format") == ["serialized"]
    text = schema.serialized if serialized and schema.serialized else schema.text
    return 200, {"schema": text, "schemaType": schema.schema_type, "references": []}
