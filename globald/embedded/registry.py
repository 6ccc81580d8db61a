"""A small local Schema Registry: the part of Confluent Schema Registry's REST API that confluent-kafka's
``SchemaRegistryClient`` and serializers call for what globald does, answered as the documented API answers them.

Two users, one piece of code: ``globald dev --registry`` serves it beside its local broker so the typed-tables page
can be tried on one machine (``serve_for_dev``), and the tests run it as their registry, in a thread of the test
process (tests/support/registry.py re-exports it); the client is always the real one. No Schema Registry server
installs here (Confluent's is Java from Maven, Karapace is not on PyPI). It keeps everything in memory, binds
127.0.0.1 only, and is a thread of its process: it goes when that process goes. What it serves, each endpoint after
the section of Confluent's "Schema Registry API Reference" (docs.confluent.io, platform
schema-registry/develop/api, and the Confluent Cloud pages of the same operations) it follows:

- ``GET /schemas/ids/{id}`` (Schemas, "Get the schema string identified by the input ID"): ``{"schema",
  "schemaType" (omitted for AVRO), "references" (omitted when none)}``; 404 with error_code 40403 "Schema not
  found". The query parameter ``format=serialized`` (same section: "for PROTOBUF type, supports 'serialized'")
  answers a PROTOBUF schema as the base64 of its ``FileDescriptorProto``, what the client's Protobuf
  deserializer asks for; other formats and other types answer the schema as registered.
- ``GET /schemas/ids/{id}/versions`` (Schemas, "List subject-versions associated to schema ID"): ``[{"subject",
  "version"}]``; 404, 40403.
- ``GET /subjects`` (Subjects, "Get a list of registered subjects"): the subjects, sorted.
- ``GET /subjects/{subject}/versions`` (Subjects, "Get a list of versions registered under the specified subject"):
  the versions; 404, 40401 "Subject not found".
- ``GET /subjects/{subject}/versions/{version}`` with a version number or ``latest`` (Subjects, "Get a specific
  version of the schema registered under this subject"): ``{"subject", "id", "version", "schema", "schemaType",
  "references"}``; 404 with 40401 (subject not found) or 40402 (version not found); 422 with 42202 for a version
  that is neither a positive number nor ``latest``; ``format=serialized`` as for ``/schemas/ids/{id}`` (the client
  fetches a Protobuf schema's references this way). ``deleted`` is accepted and changes nothing (nothing here is
  ever deleted).
- ``POST /subjects/{subject}/versions`` (Subjects, "Register a new schema under the specified subject"): ``{"id"}``;
  a schema already registered under the subject returns its id and adds no version; the same schema under
  another subject gets the same id (ids are global); 422 with 42201 for a body without a schema, an Avro schema
  that is not JSON, a reference to a subject version that does not exist, or a PROTOBUF schema that does not
  compile. ``references`` (Schemas, "Schema references": ``[{"name", "subject", "version"}]``) name the schemas a
  schema imports: a Protobuf import path, an Avro full name, a JSON Schema ``$ref``.
- ``POST /subjects/{subject}`` (Subjects, "Check if a schema has already been registered under the specified
  subject"): ``{"subject", "id", "version", "schema"}``; 404 with 40401 or 40403.

Any other path is answered 404 with error_code 404 "HTTP 404 Not Found", as the registry answers a path it does
not serve (Confluent's Protobuf serializer asks ``GET /associations/resources/...`` first and falls back on that).

Authentication (Security, "HTTP Basic Authentication" and Confluent Cloud's bearer tokens): with ``users`` set,
every request needs ``Authorization: Basic`` with one of them, with ``tokens`` set ``Authorization: Bearer`` with
one of them; otherwise 401 with error_code 40101 "Unauthorized". Error bodies are always ``{"error_code",
"message"}`` with ``Content-Type: application/vnd.schemaregistry.v1+json``, as the API's.

TLS: with ``tls`` (a certificate file and its key, ``tls_ca`` to require client certificates signed by that CA) it
serves HTTPS, as a registry behind TLS does; the client's ``ssl.ca.location``, ``ssl.certificate.location`` and
``ssl.key.location`` then apply.

Protobuf: the registry keeps a Protobuf schema as ``.proto`` text; this one compiles it (with its references, each
written under its reference name, and the well-known google/protobuf imports) with protoc from grpcio-tools, the
tests' protobuf compiler (a dev dependency: only a PROTOBUF registration needs it), to answer
``format=serialized``. Not served: a registration whose PROTOBUF schema
is itself base64 (Confluent's Python serializer registers that way; the registry would print it back as
``.proto`` text, which this one cannot): it is refused with 42201, so a test cannot rely on an answer the real
registry would not give.

Outages: ``stop()`` closes the socket (a client then gets "connection refused", as from a registry that is down);
``start()`` serves again on the same port with the same content. ``requests`` counts what was asked, by path.
The tests' double (tests/support/registry.py) adds the other ways a registry fails through ``intercept``."""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import ssl
import tempfile
import threading
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self
from urllib.parse import parse_qs, unquote, urlsplit

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
ROOT_PROTO = "default.proto"  # the name the registry's serialized form gives the schema's own file
_PROTOC = threading.Lock()


@dataclass
class _Schema:
    text: str
    kind: str  # AVRO, JSON, PROTOBUF
    references: list[dict[str, Any]] = field(default_factory=list)
    serialized: str | None = None  # PROTOBUF: base64 of the compiled FileDescriptorProto (format=serialized)

    def same(self, other: _Schema) -> bool:
        if self.kind != other.kind or self.references != other.references:
            return False
        if self.kind == "AVRO":
            try:  # the registry compares Avro schemas by their parsed form, not their whitespace
                return bool(json.loads(self.text) == json.loads(other.text))
            except ValueError:
                return False
        return self.text == other.text


class _Error(Exception):
    def __init__(self, status: int, code: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.headers = headers or {}


class LocalRegistry:
    """The registry's content (schemas by id, versions by subject) and its HTTP server on 127.0.0.1."""

    def __init__(self, users: dict[str, str] | None = None, tokens: set[str] | None = None,
                 tls: tuple[str, str] | None = None, tls_ca: str | None = None) -> None:
        self.tls, self.tls_ca = tls, tls_ca
        self.users = users or {}
        self.tokens = tokens or set()
        self.schemas: dict[int, _Schema] = {}
        self.subjects: dict[str, list[int]] = {}  # subject -> schema id of each version (version = index + 1)
        self.requests: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.connections: set[Any] = set()  # open client sockets: an outage cuts kept-alive ones too
        self.port = 0

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    # -- content, as a producer's serializer would register it -------------------------------------------------

    def register(self, subject: str, schema: str | dict[str, Any], kind: str = "AVRO",
                 references: list[dict[str, Any]] | None = None) -> int:
        """The id of ``schema`` under ``subject`` (a new version unless already there): what POST .../versions does."""
        text = schema if isinstance(schema, str) else json.dumps(schema)
        new = _Schema(text, kind, list(references or []))
        with self._lock:
            self._check_references(new)
            if kind == "PROTOBUF":
                new.serialized = self._compile(new)
            versions = self.subjects.setdefault(subject, [])
            for known in versions:
                if self.schemas[known].same(new):
                    return known
            sid = next((i for i, s in self.schemas.items() if s.same(new)), None)
            if sid is None:
                sid = max(self.schemas, default=0) + 1
                self.schemas[sid] = new
            versions.append(sid)
            return sid

    # -- the server -------------------------------------------------------------------------------------------

    def start(self) -> Self:
        server = ThreadingHTTPServer(("127.0.0.1", self.port), _handler(self))
        server.daemon_threads = True
        if self.tls is not None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*self.tls)
            if self.tls_ca is not None:
                ctx.load_verify_locations(self.tls_ca)
                ctx.verify_mode = ssl.CERT_REQUIRED
            server.socket = ctx.wrap_socket(server.socket, server_side=True)
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="local-registry", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        with self._lock:
            open_ones, self.connections = list(self.connections), set()
        for sock in open_ones:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the API ----------------------------------------------------------------------------------------------

    def intercept(self) -> _Error | None:
        """An error to answer every request with instead of its answer (it may also block first): never here, the
        tests' double overrides it to model a registry in trouble."""
        return None

    def authorized(self, header: str | None) -> bool:
        if not self.users and not self.tokens:
            return True
        if header is None:
            return False
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "basic" and self.users:
            try:
                user, _, password = base64.b64decode(value).decode().partition(":")
            except ValueError:
                return False
            return self.users.get(user) == password
        return scheme.lower() == "bearer" and value in self.tokens

    def answer(self, method: str, path: str, body: dict[str, Any] | None, query: str = "") -> Any:
        parts = [unquote(p) for p in path.strip("/").split("/")]
        serialized = parse_qs(query).get("format") == ["serialized"]
        with self._lock:
            if method == "GET" and parts[:2] == ["schemas", "ids"] and len(parts) in (3, 4):
                sid = _number(parts[2], 40403, "Schema not found")
                schema = self.schemas.get(sid)
                if schema is None:
                    raise _Error(404, 40403, f"Schema {sid} not found")
                if len(parts) == 3:
                    return _schema_doc(schema, serialized)
                if parts[3] != "versions":
                    raise _Error(404, 404, "HTTP 404 Not Found")
                return [{"subject": s, "version": v + 1} for s, ids in sorted(self.subjects.items())
                        for v, i in enumerate(ids) if i == sid]
            if method == "GET" and parts == ["subjects"]:
                return sorted(self.subjects)
            if parts[:1] != ["subjects"] or len(parts) < 2:
                raise _Error(404, 404, "HTTP 404 Not Found")
            subject = parts[1]
            if method == "POST" and len(parts) == 3 and parts[2] == "versions":
                new = _body_schema(body)
            elif method == "POST" and len(parts) == 2:
                new = _body_schema(body)
                versions = self._versions(subject)
                for v, sid in enumerate(versions):
                    if self.schemas[sid].same(new):
                        return {"subject": subject, "id": sid, "version": v + 1, **_schema_doc(self.schemas[sid])}
                raise _Error(404, 40403, "Schema not found")
            elif method == "GET" and len(parts) == 3 and parts[2] == "versions":
                return list(range(1, len(self._versions(subject)) + 1))
            elif method == "GET" and len(parts) == 4 and parts[2] == "versions":
                versions = self._versions(subject)
                if parts[3] == "latest":
                    version = len(versions)
                else:
                    version = _number(parts[3], 42202, "The specified version is not a valid version id. Allowed "
                                      "values are between [1, 2^31-1] and the string \"latest\"", status=422)
                if not 1 <= version <= len(versions):
                    raise _Error(404, 40402, f"Version {parts[3]} not found.")
                sid = versions[version - 1]
                return {"subject": subject, "id": sid, "version": version,
                        **_schema_doc(self.schemas[sid], serialized)}
            else:
                raise _Error(405, 405, "HTTP 405 Method Not Allowed")
        # registration, outside the lock (register takes it)
        return {"id": self.register(subject, new.text, new.kind, new.references)}

    def _check_references(self, schema: _Schema) -> None:
        for ref in schema.references:
            versions = self.subjects.get(str(ref.get("subject")))
            version = ref.get("version")
            if not versions or not isinstance(version, int) or not 1 <= version <= len(versions):
                raise _Error(422, 42201, f"Invalid schema: reference {ref} names no registered subject version")

    def _sources(self, schema: _Schema, into: Path) -> None:
        """Each reference's .proto text written under its reference name (an import path), recursively."""
        for ref in schema.references:
            target = self.schemas[self.subjects[ref["subject"]][ref["version"] - 1]]
            path = into / ref["name"]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(target.text)
            self._sources(target, into)

    def _compile(self, schema: _Schema) -> str:
        """The base64 FileDescriptorProto of a .proto text, as the registry's ``format=serialized`` answers it."""
        import grpc_tools  # type: ignore[import-untyped]  # a dev dependency, untyped
        from google.protobuf import descriptor_pb2
        from grpc_tools import protoc

        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            self._sources(schema, root)
            (root / ROOT_PROTO).write_text(schema.text)
            out = root / "out.desc"
            with _PROTOC:  # protoc runs in this process: one at a time
                rc = protoc.main(["protoc", f"-I{root}", f"-I{Path(grpc_tools.__file__).parent / '_proto'}",
                                  f"--descriptor_set_out={out}", str(root / ROOT_PROTO)])
            if rc != 0:
                raise _Error(422, 42201, "Invalid schema: the Protobuf schema does not compile")
            files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
        return base64.standard_b64encode(files[-1].SerializeToString()).decode("ascii")

    def _versions(self, subject: str) -> list[int]:
        versions = self.subjects.get(subject)
        if not versions:
            raise _Error(404, 40401, f"Subject '{subject}' not found.")
        return versions


def _number(text: str, code: int, message: str, status: int = 404) -> int:
    if not text.isdigit() or not 0 < int(text) < 2**31:
        raise _Error(status, code, message)
    return int(text)


def _schema_doc(schema: _Schema, serialized: bool = False) -> dict[str, Any]:
    doc: dict[str, Any] = {"schema": schema.serialized if serialized and schema.serialized else schema.text}
    if schema.kind != "AVRO":
        doc["schemaType"] = schema.kind
    if schema.references:
        doc["references"] = schema.references
    return doc


def _body_schema(body: dict[str, Any] | None) -> _Schema:
    if not isinstance(body, dict) or not isinstance(body.get("schema"), str):
        raise _Error(422, 42201, "Invalid schema: the request has no schema")
    kind = body.get("schemaType") or "AVRO"
    if kind == "AVRO":
        try:
            json.loads(body["schema"])
        except ValueError:
            raise _Error(422, 42201, "Invalid schema: not JSON") from None
    if kind == "PROTOBUF" and "syntax" not in body["schema"] and "message" not in body["schema"]:
        raise _Error(422, 42201, "Invalid schema: a serialized (base64) Protobuf schema is not served by this local "
                     "registry")
    return _Schema(body["schema"], kind, list(body.get("references") or []))


def _handler(registry: LocalRegistry) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet: the output is globald dev's, or a test's
            pass

        def setup(self) -> None:
            super().setup()
            with registry._lock:
                registry.connections.add(self.connection)

        def finish(self) -> None:
            with registry._lock:
                registry.connections.discard(self.connection)
            super().finish()

        def _serve(self, method: str) -> None:
            url = urlsplit(self.path)
            path = url.path
            registry.requests[f"{method} {path}"] += 1
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            headers: dict[str, str] = {}
            try:
                refused = registry.intercept()  # the tests' outages (tests/support/registry.py); None here
                if refused is not None:
                    headers = refused.headers
                    raise refused
                if not registry.authorized(self.headers.get("Authorization")):
                    raise _Error(401, 40101, "Unauthorized")
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    raise _Error(400, 400, "Bad Request: the body is not JSON") from None
                status, doc = 200, registry.answer(method, path, body, url.query)
            except _Error as e:
                status, doc = e.status, {"error_code": e.code, "message": e.message}
            out = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(out)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            with contextlib.suppress(OSError):  # a client that gave up meanwhile (a timeout) is gone
                self.wfile.write(out)

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

    return Handler
