"""A test double of the Confluent Schema Registry's REST API, for tests that cross processes
(a worker subprocess, Spark's Python workers, ``kmq send``) where confluent-kafka's in-process
``mock://`` registry cannot be shared.

It answers exactly the calls confluent-kafka's ``SchemaRegistryClient`` (2.16,
``schema_registry/_sync/schema_registry_client.py``) makes for serializing and deserializing:

* ``POST /subjects/{subject}/versions``      register a schema: ``{"id": N}``
* ``POST /subjects/{subject}``               look a schema up under a subject
* ``GET  /schemas/ids/{id}``                 a schema by id (``?subject=``, ``?format=`` ignored)
* ``GET  /subjects/{subject}/versions/{v}``  a version, or ``latest``
* ``GET  /subjects``                         the subjects

with the registry's error bodies (``{"error_code": 40403, "message": ...}``) and, when given
credentials, HTTP basic auth (401 otherwise), so a test proves credentials pass through. The
product code talks to it through ``SchemaRegistryClient`` only, as to a real registry. It keeps
its schemas across :meth:`stop` and :meth:`start` on the same port: a registry outage.
"""

from __future__ import annotations

import base64
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

_REGISTER = re.compile(r"^/subjects/([^/]+)/versions$")
_LOOKUP = re.compile(r"^/subjects/([^/]+)$")
_BY_ID = re.compile(r"^/schemas/ids/(\d+)$")
_VERSION = re.compile(r"^/subjects/([^/]+)/versions/(latest|-?\d+)$")


class SchemaRegistryDouble:
    """The REST double on ``127.0.0.1`` and a free port; :attr:`url` is its address.

    Args:
        user_info: ``"user:password"``: every request must carry them (basic auth).
    """

    def __init__(self, user_info: str | None = None) -> None:
        self.user_info = user_info
        #: Schema by id: {"schema": ..., "schemaType": ..., "references": [...]}.
        self.schemas: dict[int, dict[str, Any]] = {}
        #: Schema ids of each subject's versions, version 1 first.
        self.subjects: dict[str, list[int]] = {}
        #: (method, path) of every request answered, and how many were refused for auth.
        self.requests: list[tuple[str, str]] = []
        self.unauthorized = 0
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> SchemaRegistryDouble:
        """Serve (again, on the same port after :meth:`stop`)."""
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), _handler_for(self))
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop answering: connections are refused until :meth:`start`."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None

    def __enter__(self) -> SchemaRegistryDouble:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- the registry's answers (status, body) -------------------------------------------------

    def answer(self, method: str, path: str, body: dict[str, Any] | None) -> tuple[int, Any]:
        with self._lock:
            self.requests.append((method, path))
            if method == "POST" and (match := _REGISTER.match(path)):
                return 200, {"id": self._register(unquote(match[1]), body or {})}
            if method == "POST" and (match := _LOOKUP.match(path)):
                return self._lookup(unquote(match[1]), body or {})
            if method == "GET" and (match := _BY_ID.match(path)):
                found = self.schemas.get(int(match[1]))
                if found is None:
                    return 404, {"error_code": 40403, "message": "Schema not found"}
                return 200, found
            if method == "GET" and (match := _VERSION.match(path)):
                return self._version(unquote(match[1]), match[2])
            if method == "GET" and path == "/subjects":
                return 200, sorted(self.subjects)
            return 404, {"error_code": 404, "message": f"no such endpoint: {method} {path}"}

    def _register(self, subject: str, body: dict[str, Any]) -> int:
        schema = _stored_schema(body)
        schema_id = next((i for i, s in self.schemas.items() if s == schema), None)
        if schema_id is None:
            schema_id = len(self.schemas) + 1
            self.schemas[schema_id] = schema
        versions = self.subjects.setdefault(subject, [])
        if schema_id not in versions:
            versions.append(schema_id)
        return schema_id

    def _lookup(self, subject: str, body: dict[str, Any]) -> tuple[int, Any]:
        if subject not in self.subjects:
            return 404, {"error_code": 40401, "message": f"Subject '{subject}' not found."}
        schema = _stored_schema(body)
        for version, schema_id in enumerate(self.subjects[subject], start=1):
            if self.schemas[schema_id] == schema:
                return 200, self._registered(subject, version, schema_id)
        return 404, {"error_code": 40403, "message": "Schema not found"}

    def _version(self, subject: str, asked: str) -> tuple[int, Any]:
        versions = self.subjects.get(subject)
        if not versions:
            return 404, {"error_code": 40401, "message": f"Subject '{subject}' not found."}
        number = len(versions) if asked in ("latest", "-1") else int(asked)
        if not 1 <= number <= len(versions):
            return 404, {"error_code": 40402, "message": f"Version {asked} not found."}
        return 200, self._registered(subject, number, versions[number - 1])

    def _registered(self, subject: str, version: int, schema_id: int) -> dict[str, Any]:
        return {"subject": subject, "version": version, "id": schema_id, **self.schemas[schema_id]}


def _stored_schema(body: dict[str, Any]) -> dict[str, Any]:
    return {
        "schema": body.get("schema"),
        "schemaType": body.get("schemaType") or "AVRO",
        "references": body.get("references") or [],
    }


def _handler_for(double: SchemaRegistryDouble) -> type[BaseHTTPRequestHandler]:
    expected = (
        "Basic " + base64.b64encode(double.user_info.encode()).decode()
        if double.user_info
        else None
    )

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

        def _serve(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if expected is not None and self.headers.get("Authorization") != expected:
                with double._lock:
                    double.unauthorized += 1
                self._send(401, {"error_code": 401, "message": "Unauthorized"})
                return
            body = json.loads(raw) if raw else None
            status, answer = double.answer(method, urlsplit(self.path).path, body)
            self._send(status, answer)

        def _send(self, status: int, answer: Any) -> None:
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler
