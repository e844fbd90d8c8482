"""A test double of the Confluent Schema Registry's REST API: not a registry, the few answers
kmq's code gets from one, over real HTTP on a free loopback port. confluent-kafka's
``SchemaRegistryClient`` talks to it as to a real registry, from any process (a worker
subprocess, Spark's Python workers, ``kmq send``), where its in-process ``mock://`` registry
cannot be shared.

It answers the calls ``SchemaRegistryClient`` (2.16) makes to serialize, deserialize and preview:

* ``POST /subjects/{subject}/versions``      register a schema: ``{"id": N}``
* ``POST /subjects/{subject}``               look a schema up under a subject
* ``GET  /schemas/ids/{id}``                 a schema by id; a Protobuf one :meth:`put` with
  ``serialized=`` is answered as ``.proto`` text unless ``?format=serialized`` (``?subject=``
  is ignored); a registered one is answered as registered
* ``GET  /schemas/ids/{id}/versions``        its subject-version pairs
* ``GET  /subjects/{subject}/versions/{v}``  a version, or ``latest``
* ``GET  /subjects``                         the subjects

with Confluent's error bodies (``{"error_code": 40403, "message": ...}`` for an unknown id).
A test registers schemas through a client or puts one with a chosen id, subject and version
(:meth:`put`); ``user_info`` asks for HTTP basic auth (401 otherwise, counted in
:attr:`unauthorized`); :attr:`failing_with` makes every answer that status; :attr:`requests`
logs what was asked. Schemas survive :meth:`stop` and :meth:`start` on the same port: an outage.
"""

from __future__ import annotations

import base64
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NamedTuple
from urllib.parse import parse_qsl, unquote, urlsplit

_REGISTER = re.compile(r"^/subjects/([^/]+)/versions$")
_LOOKUP = re.compile(r"^/subjects/([^/]+)$")
_BY_ID = re.compile(r"^/schemas/ids/(\d+)(/versions)?$")
_VERSION = re.compile(r"^/subjects/([^/]+)/versions/(latest|-?\d+)$")
_UNKNOWN_ID = {"error_code": 40403, "message": "Schema not found"}


@dataclass
class StoredSchema:
    """A schema as the registry answers it."""

    text: str
    schema_type: str = "AVRO"
    references: list[dict[str, Any]] = field(default_factory=list)
    #: A Protobuf schema as base64 ``FileDescriptorProto``, answered for ``?format=serialized``.
    serialized: str | None = None

    def answer(self, query: dict[str, str]) -> dict[str, Any]:
        wants_serialized = query.get("format") == "serialized" and self.serialized
        text = self.serialized if wants_serialized else self.text
        return {"schema": text, "schemaType": self.schema_type, "references": self.references}


class Request(NamedTuple):
    method: str
    path: str
    query: dict[str, str]


class SchemaRegistryDouble:
    """The REST double on ``127.0.0.1`` and a free port; :attr:`url` is its address.

    Args:
        user_info: ``"user:password"``: every request must carry them (basic auth).
    """

    def __init__(self, user_info: str | None = None) -> None:
        self.user_info = user_info
        self.schemas: dict[int, StoredSchema] = {}
        #: Schema id of each subject's versions.
        self.subjects: dict[str, dict[int, int]] = {}
        #: Every request answered (refused ones too), in order.
        self.requests: list[Request] = []
        #: Requests refused for want of the credentials.
        self.unauthorized = 0
        #: An HTTP status every answer has while set (say 503: a registry in trouble).
        self.failing_with: int | None = None
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def put(self, schema_id: int, subject: str, version: int, schema: StoredSchema) -> None:
        """Store ``schema`` as ``schema_id`` and as ``version`` of ``subject``, as if registered."""
        with self._lock:
            self.schemas[schema_id] = schema
            self.subjects.setdefault(subject, {})[version] = schema_id

    def asked(self, method: str, path: str) -> list[Request]:
        """The requests made with ``method`` to ``path`` (without its query)."""
        with self._lock:
            return [r for r in self.requests if (r.method, r.path) == (method, path)]

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

    def answer(self, request: Request, body: dict[str, Any] | None) -> tuple[int, Any]:
        with self._lock:
            if self.failing_with is not None:
                return self.failing_with, {"error_code": self.failing_with, "message": "failing"}
            method, path = request.method, request.path
            if method == "POST" and (match := _REGISTER.match(path)):
                return 200, {"id": self._register(unquote(match[1]), _stored(body or {}))}
            if method == "POST" and (match := _LOOKUP.match(path)):
                return self._lookup(unquote(match[1]), _stored(body or {}))
            if method == "GET" and (match := _BY_ID.match(path)):
                return self._by_id(int(match[1]), bool(match[2]), request.query)
            if method == "GET" and (match := _VERSION.match(path)):
                return self._version(unquote(match[1]), match[2])
            if method == "GET" and path == "/subjects":
                return 200, sorted(self.subjects)
            return 404, {"error_code": 404, "message": f"no such endpoint: {method} {path}"}

    def _register(self, subject: str, schema: StoredSchema) -> int:
        schema_id = next((i for i, s in self.schemas.items() if s == schema), None)
        if schema_id is None:
            schema_id = max(self.schemas, default=0) + 1
            self.schemas[schema_id] = schema
        versions = self.subjects.setdefault(subject, {})
        if schema_id not in versions.values():
            versions[max(versions, default=0) + 1] = schema_id
        return schema_id

    def _lookup(self, subject: str, schema: StoredSchema) -> tuple[int, Any]:
        if subject not in self.subjects:
            return 404, {"error_code": 40401, "message": f"Subject '{subject}' not found."}
        for version, schema_id in sorted(self.subjects[subject].items()):
            if self.schemas[schema_id] == schema:
                return 200, self._registered(subject, version, schema_id)
        return 404, _UNKNOWN_ID

    def _by_id(self, schema_id: int, versions: bool, query: dict[str, str]) -> tuple[int, Any]:
        schema = self.schemas.get(schema_id)
        if schema is None:
            return 404, _UNKNOWN_ID
        if not versions:
            return 200, schema.answer(query)
        return 200, [
            {"subject": subject, "version": version}
            for subject, by_version in sorted(self.subjects.items())
            for version, an_id in sorted(by_version.items())
            if an_id == schema_id
        ]

    def _version(self, subject: str, asked: str) -> tuple[int, Any]:
        versions = self.subjects.get(subject)
        if not versions:
            return 404, {"error_code": 40401, "message": f"Subject '{subject}' not found."}
        number = max(versions) if asked in ("latest", "-1") else int(asked)
        if number not in versions:
            return 404, {"error_code": 40402, "message": f"Version {asked} not found."}
        return 200, self._registered(subject, number, versions[number])

    def _registered(self, subject: str, version: int, schema_id: int) -> dict[str, Any]:
        schema = self.schemas[schema_id].answer({})
        return {"subject": subject, "version": version, "id": schema_id, **schema}


def _stored(body: dict[str, Any]) -> StoredSchema:
    return StoredSchema(
        text=body.get("schema") or "",
        schema_type=body.get("schemaType") or "AVRO",
        references=body.get("references") or [],
    )


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
            url = urlsplit(self.path)
            request = Request(method, url.path, dict(parse_qsl(url.query)))
            with double._lock:
                double.requests.append(request)
            if expected is not None and self.headers.get("Authorization") != expected:
                with double._lock:
                    double.unauthorized += 1
                self._send(401, {"error_code": 401, "message": "Unauthorized"})
                return
            self._send(*double.answer(request, json.loads(raw) if raw else None))

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
