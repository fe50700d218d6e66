"""A small HTTP reverse proxy on loopback that injects S3 errors, for fault tests.

    with FaultProxy("http://127.0.0.1:5000", fail_every=4) as proxy:
        store = S3Store("s3://bucket/prefix", endpoint_url=proxy.url)
        ...
        assert proxy.failures_injected > 0

Every request is forwarded unchanged (Host header included, so SigV4 signatures
stay valid) except those chosen to fail, which get an S3 error response
(``500 InternalError``, ``503 SlowDown``... with the S3 XML body) without reaching
the upstream. The choice is deterministic: every ``fail_every``-th eligible request
and/or a ``fail_rate`` fraction drawn from ``random.Random(seed)``. ``fail_if``
narrows which requests are eligible (and counted), e.g. only part uploads:

    FaultProxy(upstream, fail_every=1, fail_if=lambda r: "partNumber=2" in r.path)

The proxy also counts the bytes it relays, so a test can check how much of an object a
reader fetched (:attr:`response_bytes`, :attr:`requests`).
"""

from __future__ import annotations

import http.client
import random
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

__all__ = ["S3_ERRORS", "FaultProxy", "ProxiedRequest"]

#: Error codes the proxy can answer with: code -> (HTTP status, message).
S3_ERRORS: dict[str, tuple[int, str]] = {
    "InternalError": (500, "We encountered an internal error. Please try again."),
    "SlowDown": (503, "Please reduce your request rate."),
    "ServiceUnavailable": (503, "Service is unable to handle request."),
    "RequestTimeout": (
        400,
        "Your socket connection to the server was not read from "
        "or written to within the timeout period.",
    ),
}

_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailers",
    "transfer-encoding",
    "upgrade",
    "expect",
}


@dataclass
class ProxiedRequest:
    """One request as the proxy saw it."""

    method: str
    path: str
    status: int = 0
    injected: str | None = None  # the error code injected, if any
    request_bytes: int = 0
    response_bytes: int = 0


class FaultProxy:
    """Forward HTTP to ``upstream_url``, failing a deterministic share of requests."""

    def __init__(
        self,
        upstream_url: str,
        *,
        fail_every: int = 0,
        fail_rate: float = 0.0,
        seed: int = 0,
        errors: Iterable[str] = ("InternalError", "SlowDown"),
        fail_if: Callable[[ProxiedRequest], bool] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ):
        parts = urlsplit(upstream_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"upstream must be an http:// URL, got {upstream_url!r}")
        self.upstream_host = parts.hostname
        self.upstream_port = parts.port or 80
        self.errors = tuple(errors)
        unknown = [e for e in self.errors if e not in S3_ERRORS]
        if unknown or not self.errors:
            raise ValueError(f"errors must be among {sorted(S3_ERRORS)}, got {self.errors}")
        self.fail_every = fail_every
        self.fail_rate = fail_rate
        self.fail_if = fail_if
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._host, self._port = host, port
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.reset_counters()

    # -- counters

    def reset_counters(self) -> None:
        with self._lock:
            self.eligible_seen = 0
            self.failures_injected = 0
            self.requests: list[ProxiedRequest] = []

    @property
    def response_bytes(self) -> int:
        """Body bytes relayed from upstream to clients (what readers downloaded)."""
        with self._lock:
            return sum(r.response_bytes for r in self.requests)

    @property
    def request_bytes(self) -> int:
        """Body bytes relayed from clients to upstream (what writers uploaded)."""
        with self._lock:
            return sum(r.request_bytes for r in self.requests)

    def _decide(self, request: ProxiedRequest) -> str | None:
        if self.fail_if is not None and not self.fail_if(request):
            return None
        with self._lock:
            self.eligible_seen += 1
            fail = bool(self.fail_every) and self.eligible_seen % self.fail_every == 0
            if self.fail_rate and self._rng.random() < self.fail_rate:
                fail = True
            if not fail:
                return None
            code = self.errors[self.failures_injected % len(self.errors)]
            self.failures_injected += 1
            return code

    # -- lifecycle

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("FaultProxy is not started")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FaultProxy:
        handler = type("_Handler", (_ProxyHandler,), {"proxy": self})
        server = ThreadingHTTPServer((self._host, self._port), handler)
        server.daemon_threads = True
        server.block_on_close = False  # idle keep-alive clients must not block stop()
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, name="fault-proxy", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class _ProxyHandler(BaseHTTPRequestHandler):
    proxy: FaultProxy
    protocol_version = "HTTP/1.1"  # keep-alive, and "Expect: 100-continue" handled
    timeout = 30  # close idle client connections

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            raw = bytearray()  # relayed as-is, chunk framing included
            while True:
                line = self.rfile.readline()
                raw += line
                size = int(line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while True:  # trailers, up to the blank line
                        trailer = self.rfile.readline()
                        raw += trailer
                        if trailer in (b"\r\n", b"\n", b""):
                            return bytes(raw)
                raw += self.rfile.read(size + 2)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _handle(self) -> None:
        record = ProxiedRequest(self.command, self.path)
        body = self._read_body()
        record.request_bytes = len(body)
        code = self.proxy._decide(record)
        if code is not None:
            record.injected = code
            status, message = S3_ERRORS[code]
            xml = (
                '<?xml version="1.0" encoding="UTF-8"?>\n'
                f"<Error><Code>{code}</Code><Message>{message}</Message>"
                "<RequestId>FAULTPROXY</RequestId><HostId>fault-proxy</HostId></Error>"
            ).encode()
            self._respond(
                record,
                status,
                [("Content-Type", "application/xml"), ("x-amz-request-id", "FAULTPROXY")],
                xml,
            )
            return
        conn = http.client.HTTPConnection(
            self.proxy.upstream_host, self.proxy.upstream_port, timeout=60
        )
        try:
            conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            chunked = False
            for name, value in self.headers.items():
                lname = name.lower()
                if lname == "transfer-encoding" and "chunked" in value.lower():
                    chunked = True
                    conn.putheader(name, value)
                elif lname not in _HOP_BY_HOP:
                    conn.putheader(name, value)
            conn.endheaders()
            if body:
                conn.send(body)
            elif chunked:
                conn.send(b"0\r\n\r\n")
            response = conn.getresponse()
            data = response.read()
            headers = [
                (k, v)
                for k, v in response.getheaders()
                if k.lower() not in _HOP_BY_HOP and k.lower() != "content-length"
            ]
            if self.command == "HEAD":
                length = response.getheader("Content-Length")
                if length is not None:
                    headers.append(("Content-Length", length))
            record.response_bytes = len(data)
            self._respond(record, response.status, headers, data, reason=response.reason)
        except OSError as exc:
            xml = (
                '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>BadGateway'
                f"</Code><Message>fault proxy: upstream failed: {exc}</Message></Error>"
            ).encode()
            self._respond(record, 502, [("Content-Type", "application/xml")], xml)
        finally:
            conn.close()

    def _respond(
        self,
        record: ProxiedRequest,
        status: int,
        headers: list[tuple[str, str]],
        data: bytes,
        reason: str | None = None,
    ) -> None:
        record.status = status
        with self.proxy._lock:
            self.proxy.requests.append(record)
        self.send_response_only(status, reason)
        for name, value in headers:
            self.send_header(name, value)
        if self.command != "HEAD":
            self.send_header("Content-Length", str(len(data)))
        elif not any(k.lower() == "content-length" for k, _ in headers):
            self.send_header("Content-Length", "0")
        self.end_headers()
        if self.command != "HEAD" and data:
            self.wfile.write(data)
        self.wfile.flush()

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = _handle
