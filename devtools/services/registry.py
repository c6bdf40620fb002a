"""A stand-in Confluent Schema Registry for development and tests (not installed with the product).

No Confluent-compatible registry server installs from the package registries reachable here, so
this small server speaks the subset of the Schema Registry REST API that
``confluent_kafka.schema_registry.SchemaRegistryClient`` uses:

- ``POST /subjects/{s}/versions`` (register; the same schema text gets the same id everywhere),
  ``GET /subjects``, ``GET /subjects/{s}/versions``, ``GET /subjects/{s}/versions/{latest|N}``,
  ``POST /subjects/{s}`` (lookup)
- ``GET /schemas/ids/{id}``, ``GET /schemas/types``
- ``POST /compatibility/subjects/{s}/versions/{latest|N}``
- ``GET/PUT /config`` and ``GET/PUT /config/{s}``

Schema types AVRO, PROTOBUF and JSON. Avro compatibility (default ``BACKWARD``; also ``FORWARD``,
``FULL``, their ``_TRANSITIVE`` forms and ``NONE``) is checked by PyPI ``avro``'s
``ReaderWriterCompatibilityChecker``; Protobuf and JSON schemas are stored without a
compatibility check. Protobuf schemas are stored as registered: confluent-kafka's
``ProtobufSerializer`` registers a base64 ``FileDescriptorProto``, which is what
``?format=serialized`` readers expect. State persists in ``<data_dir>/registry.json``.

Run: ``python -m devtools.services.registry --data-dir DIR --port P`` or :func:`start` / :func:`stop`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

from devtools.services.devbroker import port_open

LEVELS = ("NONE", "BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE", "FULL", "FULL_TRANSITIVE")
_JSON = "application/vnd.schemaregistry.v1+json"


class RegistryHttpError(Exception):
    """An error answer: HTTP status, Confluent error code and message."""

    def __init__(self, status: int, code: int, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class Store:
    """Schemas, subjects and compatibility settings, persisted as JSON in ``path`` on every change."""

    def __init__(self, path: Path):
        self.path = path
        self.lock = threading.Lock()
        if path.exists():
            self.data = json.loads(path.read_text())
        else:
            self.data = {"next_id": 1, "schemas": {}, "subjects": {}, "config": {"global": "BACKWARD", "subjects": {}}}

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, sort_keys=True))
        os.replace(tmp, self.path)

    def schema(self, schema_id: int) -> dict:
        found = self.data["schemas"].get(str(schema_id))
        if found is None:
            raise RegistryHttpError(404, 40403, f"Schema {schema_id} not found")
        return found

    def versions(self, subject: str) -> list[int]:
        ids = self.data["subjects"].get(subject)
        if not ids:
            raise RegistryHttpError(404, 40401, f"Subject '{subject}' not found.")
        return ids

    def version(self, subject: str, version: str) -> tuple[int, int]:
        """(version number, schema id) of ``version`` (a number, ``latest`` or ``-1``)."""
        ids = self.versions(subject)
        if version in ("latest", "-1"):
            return len(ids), ids[-1]
        n = int(version)
        if not 1 <= n <= len(ids):
            raise RegistryHttpError(404, 40402, f"Version {version} not found.")
        return n, ids[n - 1]

    def level(self, subject: str | None) -> str:
        cfg = self.data["config"]
        return cfg["subjects"].get(subject) or cfg["global"] if subject else cfg["global"]

    def id_for(self, body: dict) -> int | None:
        for sid, entry in self.data["schemas"].items():
            if _same(entry, body):
                return int(sid)
        return None


def _same(entry: dict, body: dict) -> bool:
    return (
        entry["schemaType"] == body.get("schemaType", "AVRO")
        and _canonical(entry["schemaType"], entry["schema"]) == _canonical(entry["schemaType"], body["schema"])
        and entry.get("references", []) == body.get("references", [])
    )


def _canonical(schema_type: str, text: str) -> str:
    if schema_type in ("AVRO", "JSON"):
        try:
            return json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))
        except ValueError:
            return text
    return text


def _parse_avro(text: str):
    import avro.errors
    import avro.schema

    try:
        return avro.schema.parse(text)
    except (avro.errors.AvroException, ValueError) as e:
        raise RegistryHttpError(422, 42201, f"Invalid schema: {e}") from None


def _validate(body: dict) -> None:
    schema_type = body.get("schemaType", "AVRO")
    if schema_type not in ("AVRO", "PROTOBUF", "JSON"):
        raise RegistryHttpError(422, 42201, f"Invalid schema type {schema_type}")
    if not isinstance(body.get("schema"), str):
        raise RegistryHttpError(422, 42201, "Invalid schema: 'schema' must be a string")
    if schema_type == "AVRO":
        _parse_avro(body["schema"])
    elif schema_type == "JSON":
        try:
            json.loads(body["schema"])
        except ValueError as e:
            raise RegistryHttpError(422, 42201, f"Invalid schema: {e}") from None


def incompatibilities(store: Store, subject: str, body: dict, against: list[int] | None = None) -> list[str]:
    """Why ``body`` may not follow the subject's versions under its compatibility level ([] = fine).

    ``against`` overrides the schema ids compared with (default: by the level, the latest one
    or, for ``*_TRANSITIVE``, all). Only Avro is checked; other types always pass.
    """
    from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType

    ids = store.data["subjects"].get(subject) or []
    level = store.level(subject)
    if body.get("schemaType", "AVRO") != "AVRO" or not ids or level == "NONE":
        return []
    if against is None:
        against = ids if level.endswith("_TRANSITIVE") else ids[-1:]
    new = _parse_avro(body["schema"])
    problems: list[str] = []
    checker = ReaderWriterCompatibilityChecker()
    for sid in against:
        old = _parse_avro(store.schema(sid)["schema"])
        pairs = []
        if level.startswith(("BACKWARD", "FULL")):
            pairs.append(("BACKWARD", new, old))
        if level.startswith(("FORWARD", "FULL")):
            pairs.append(("FORWARD", old, new))
        for kind, reader, writer in pairs:
            result = checker.get_compatibility(reader, writer)
            if result.compatibility is not SchemaCompatibilityType.compatible:
                detail = "; ".join(
                    f"{m} at {'/'.join(loc) if isinstance(loc, list) else loc}"
                    for m, loc in zip(result.messages, result.locations)
                )
                problems.append(f"{kind} incompatible with schema id {sid}: {detail}")
    return problems


def _register(store: Store, subject: str, body: dict) -> dict:
    _validate(body)
    body = {
        "schema": body["schema"],
        "schemaType": body.get("schemaType", "AVRO"),
        "references": body.get("references") or [],
    }
    ids = store.data["subjects"].get(subject) or []
    existing = store.id_for(body)
    if existing is not None and existing in ids:
        return {"id": existing}
    problems = incompatibilities(store, subject, body)
    if problems:
        raise RegistryHttpError(
            409, 409, "Schema being registered is incompatible with an earlier schema; " + " | ".join(problems)
        )
    if existing is None:
        existing = store.data["next_id"]
        store.data["next_id"] += 1
        store.data["schemas"][str(existing)] = body
    store.data["subjects"][subject] = ids + [existing]
    store.save()
    return {"id": existing}


def _registered(store: Store, subject: str, version: int, sid: int) -> dict:
    entry = store.schema(sid)
    return {
        "subject": subject,
        "version": version,
        "id": sid,
        "schema": entry["schema"],
        "schemaType": entry["schemaType"],
        "references": entry.get("references", []),
    }


def _lookup(store: Store, subject: str, body: dict) -> dict:
    ids = store.versions(subject)
    for n, sid in enumerate(ids, start=1):
        if _same(store.schema(sid), body):
            return _registered(store, subject, n, sid)
    raise RegistryHttpError(404, 40403, "Schema not found")


def _compatibility(store: Store, subject: str, version: str, body: dict) -> dict:
    _validate(body)
    if subject not in store.data["subjects"]:
        return {"is_compatible": True}
    _, sid = store.version(subject, version)
    against = None if version in ("latest", "-1") and store.level(subject).endswith("_TRANSITIVE") else [sid]
    problems = incompatibilities(store, subject, body, against)
    return {"is_compatible": not problems, "messages": problems}


def _put_config(store: Store, subject: str | None, body: dict) -> dict:
    level = (body.get("compatibility") or body.get("compatibilityLevel") or "").upper()
    if level not in LEVELS:
        raise RegistryHttpError(422, 42203, f"Invalid compatibility level {level!r}; one of {LEVELS}")
    if subject:
        store.data["config"]["subjects"][subject] = level
    else:
        store.data["config"]["global"] = level
    store.save()
    return {"compatibility": level}


def _get_config(store: Store, subject: str | None, query: dict) -> dict:
    if subject and subject not in store.data["config"]["subjects"] and query.get("defaultToGlobal") != "true":
        raise RegistryHttpError(404, 40408, f"Subject '{subject}' does not have subject-level compatibility configured")
    return {"compatibilityLevel": store.level(subject)}


_ROUTES = [  # (method, pattern, handler(store, match, query, body))
    ("GET", r"/subjects", lambda s, m, q, b: sorted(s.data["subjects"])),
    ("GET", r"/schemas/types", lambda s, m, q, b: ["AVRO", "PROTOBUF", "JSON"]),
    ("GET", r"/schemas/ids/(\d+)", lambda s, m, q, b: s.schema(int(m[1]))),
    ("POST", r"/subjects/([^/]+)/versions", lambda s, m, q, b: _register(s, m[1], b)),
    ("GET", r"/subjects/([^/]+)/versions", lambda s, m, q, b: list(range(1, len(s.versions(m[1])) + 1))),
    ("GET", r"/subjects/([^/]+)/versions/([^/]+)", lambda s, m, q, b: _registered(s, m[1], *s.version(m[1], m[2]))),
    ("POST", r"/subjects/([^/]+)", lambda s, m, q, b: _lookup(s, m[1], b)),
    ("POST", r"/compatibility/subjects/([^/]+)/versions/([^/]+)", lambda s, m, q, b: _compatibility(s, m[1], m[2], b)),
    ("GET", r"/config", lambda s, m, q, b: _get_config(s, None, q)),
    ("PUT", r"/config", lambda s, m, q, b: _put_config(s, None, b)),
    ("GET", r"/config/([^/]+)", lambda s, m, q, b: _get_config(s, m[1], q)),
    ("PUT", r"/config/([^/]+)", lambda s, m, q, b: _put_config(s, m[1], b)),
]


def make_handler(store: Store, basic_auth: str | None = None):
    """The request handler class serving ``store``; with ``basic_auth`` (``user:password``) every
    request must carry those HTTP basic credentials (401 otherwise)."""
    import base64

    expected = "Basic " + base64.b64encode(basic_auth.encode()).decode() if basic_auth else None

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):  # quiet: the tests and the demo print their own progress
            pass

        def _answer(self, status: int, payload) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", _JSON)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _serve(self, method: str) -> None:
            url = urlparse(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            length = int(self.headers.get("Content-Length") or 0)
            try:
                if expected and self.headers.get("Authorization") != expected:
                    self.rfile.read(length)
                    raise RegistryHttpError(401, 401, "Unauthorized")
                body = json.loads(self.rfile.read(length)) if length else {}
                path = url.path.rstrip("/") or "/"
                for verb, pattern, handler in _ROUTES:
                    m = re.fullmatch(pattern, path)
                    if verb == method and m:
                        groups = [None] + [unquote(g) for g in m.groups()]
                        with store.lock:
                            return self._answer(200, handler(store, groups, query, body))
                raise RegistryHttpError(404, 404, f"HTTP 404 {method} {url.path} is not served by this stand-in")
            except RegistryHttpError as e:
                self._answer(e.status, {"error_code": e.code, "message": e.message})
            except (ValueError, KeyError) as e:
                self._answer(422, {"error_code": 422, "message": f"Unprocessable request: {e}"})

        def do_GET(self):
            self._serve("GET")

        def do_POST(self):
            self._serve("POST")

        def do_PUT(self):
            self._serve("PUT")

    return Handler


DEV_PORT = int(os.environ.get("LAKE_DEV_REGISTRY_PORT", "18081"))
"""Port of the stand-in registry that ``make demo`` and ``make dev`` start when
``LAKE_SCHEMA_REGISTRY_URL`` is unset (data under ``$LAKE_HOME/registry``)."""


def serve(data_dir: Path, port: int, host: str = "127.0.0.1", basic_auth: str | None = None) -> ThreadingHTTPServer:
    """A server (not yet serving) on ``host:port`` whose state lives in ``data_dir/registry.json``."""
    data_dir.mkdir(parents=True, exist_ok=True)
    server = ThreadingHTTPServer((host, port), make_handler(Store(data_dir / "registry.json"), basic_auth))
    server.daemon_threads = True
    return server


def start(
    data_dir: Path, port: int, host: str = "127.0.0.1", wait_s: float = 15.0, basic_auth: str | None = None
) -> str:
    """Start the stand-in registry as a child process on ``host:port`` (idempotent); returns its URL.

    With ``basic_auth`` (``user:password``) it answers 401 to requests without those credentials.

    Its pid is kept in ``data_dir/registry.pid``; its state in ``data_dir/registry.json`` survives
    a restart with the same ``data_dir``.

    Raises:
        RuntimeError: it did not accept connections within ``wait_s`` seconds.
    """
    url = f"http://{host}:{port}"
    data_dir.mkdir(parents=True, exist_ok=True)
    if port_open(host, port):
        return url
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    log = open(data_dir / "registry.log", "ab")
    args = ["--basic-auth", basic_auth] if basic_auth else []
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "devtools.services.registry",
            "--data-dir",
            str(data_dir),
            "--port",
            str(port),
            "--host",
            host,
            *args,
        ],
        cwd=root,
        env=env,
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    (data_dir / "registry.pid").write_text(str(proc.pid))
    deadline = time.monotonic() + wait_s
    while not port_open(host, port):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the stand-in schema registry did not start on {url} (log: {data_dir}/registry.log)")
        time.sleep(0.05)
    return url


def stop(data_dir: Path, wait_s: float = 10.0) -> None:
    """Stop the registry started by :func:`start` with this ``data_dir`` (its state is kept)."""
    pid_file = data_dir / "registry.pid"
    if not pid_file.exists():
        return
    pid = int(pid_file.read_text())
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pid_file.unlink(missing_ok=True)
        return
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)
    pid_file.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:  # our child: reap it
            return False
    except ChildProcessError:  # started by another process
        pass
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", type=Path, required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--basic-auth", help="user:password every request must carry")
    args = p.parse_args(argv)
    server = serve(args.data_dir, args.port, args.host, args.basic_auth)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    server.serve_forever()
    server.server_close()


if __name__ == "__main__":
    main()
