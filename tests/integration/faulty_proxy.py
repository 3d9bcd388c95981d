"""An HTTP proxy in front of the S3 test server that fails some requests on purpose.

`FaultyProxy(upstream, plan)` answers the n-th request with what
`plan(n, method, path, range)` returns (*range*: the request's Range header, or None):
"pass" (forward it), "total" (forward it, and answer with a Content-Range whose total,
the object's size, is one more than the server said: a broken server or proxy), "whole"
(forward it without its Range header: a 200 with the whole object, as a server that
ignores ranges answers), "size" (forward it, and say every object is a byte larger than
it is: a HEAD's Content-Length, each `<Size>` of a LIST answer; the bytes of any other
GET are untouched, as a listing out of step with the objects says),
"slowdown" (503 SlowDown, what S3 says when throttling), "forbidden"
(403 AccessDenied, what S3 says to a request it will not take), "refuse" (the same 403
sent before reading any of the body, then the connection closed), "reset"
(close the connection without an answer), "cut" (forward it, then send the headers and
only the first half of the body, and close), "hold" (send the headers and the first half
of the body, set `holding`, then trickle one more byte every half second, so that no read
timeout ever fires and the body never ends, until the proxy is closed: a stalled server; for
a PUT, set `holding` and read none of the upload until the proxy is closed), or "pause"
(a GET: send the headers and the first half of the body, set `holding`, and send the rest
once `resume` is set: a transfer stalled mid-body that then goes on), or "flip" (forward
it, and flip every bit of the middle byte of a GET's body, headers untouched: a network
path that corrupts what it carries, the same way every time).
`ranges` records every GET's Range header, `gets` every GET's path (with its query) and
Range header, `puts` every PUT's path and headers, `put_crc32` the CRC32 of the body each
PUT that sent one by its Content-Length carried (as S3 writes it: base64 of 4 big-endian
bytes), by path. It runs in a thread on a free loopback port; given an `ssl.SSLContext`
(*tls*) it answers https.
"""

from __future__ import annotations

import base64
import http.client
import re
import ssl
import threading
import zlib
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import BinaryIO, Literal
from urllib.parse import urlsplit

Fault = Literal["pass", "total", "whole", "size", "slowdown", "forbidden", "refuse", "reset",
                "cut", "hold", "pause", "flip"]
SLOWDOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message>"
    b"<RequestId>FAULTYPROXY</RequestId></Error>"
)
FORBIDDEN = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code>'
    b"<Message>Access Denied</Message><RequestId>FAULTYPROXY</RequestId></Error>"
)


def _read_body(rfile: BinaryIO, length: str | None, encoding: str | None) -> bytes | None:
    """A request's body as it came, to be forwarded as it came: by Content-Length, or the
    raw chunks of `Transfer-Encoding: chunked` through the last one and its trailers (what
    botocore sends over https: an aws-chunked body with its checksum in a trailer)."""
    if "chunked" not in (encoding or "").lower():
        size = int(length or 0)
        return rfile.read(size) if size else None
    raw = bytearray()
    while True:
        line = rfile.readline()
        raw += line
        size = int(line.split(b";")[0].strip() or b"0", 16)
        if size == 0:
            while (trailer := rfile.readline()) not in (b"\r\n", b"\n", b""):
                raw += trailer
            raw += b"\r\n"
            return bytes(raw)
        raw += rfile.read(size + 2)  # the chunk and its CRLF


def _crc32(data: bytes) -> str:
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode("ascii")


def _larger_sizes(listing: bytes) -> bytes:
    """A LIST answer whose every `<Size>n</Size>` says n + 1."""
    return re.sub(rb"<Size>(\d+)</Size>",
                  lambda m: b"<Size>%d</Size>" % (int(m.group(1)) + 1), listing)


def _head_length(answer: http.client.HTTPResponse, fault: Fault) -> str:
    """A HEAD's Content-Length: the object's size (one more under "size")."""
    length = answer.getheader("Content-Length", "0")
    return str(int(length) + 1) if fault == "size" and length.isdigit() else length


def _wrong_total(content_range: str) -> str:
    """`bytes 0-9/100` as `bytes 0-9/101`: the same bytes, said to be of a larger object."""
    span, _, total = content_range.rpartition("/")
    return f"{span}/{int(total) + 1}" if total.isdigit() else content_range


class FaultyProxy:
    def __init__(self, upstream: str, plan: Callable[[int, str, str, str | None], Fault],
                 *, tls: ssl.SSLContext | None = None) -> None:
        target = urlsplit(upstream)
        self.faults: list[Fault] = []
        self.gets: list[tuple[str, str | None]] = []
        self.puts: list[tuple[str, dict[str, str]]] = []
        self.put_crc32: dict[str, str] = {}
        self.holding = threading.Event()
        """Set once a "hold" answer has sent half its body and is stalling."""
        self.released = threading.Event()
        """Set when the proxy closes: stalled answers end then."""
        self.resume = threading.Event()
        """Set to let a "pause" answer send the rest of its body."""
        lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                del format, args

            def _error(self, status: int, document: bytes, *, close: bool = False) -> None:
                """S3's error answer: *status* and its XML *document*."""
                self.send_response(status)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(document)))
                if close:
                    self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(document)

            def _before_body(self, fault: Fault) -> bool:
                """The faults that read none of the request's body; True: it was one."""
                if fault == "hold" and self.command == "PUT":  # stop reading the upload
                    proxy.holding.set()
                    proxy.released.wait()
                elif fault == "refuse":  # answer at once, read none of the body, hang up
                    self._error(403, FORBIDDEN, close=True)
                    self.wfile.flush()
                else:
                    return False
                self.close_connection = True
                self.connection.close()
                return True

            def _request_body(self) -> bytes | None:
                """The request's body as it came (a plain PUT's CRC32 noted)."""
                body = _read_body(self.rfile, self.headers.get("Content-Length"),
                                  self.headers.get("Transfer-Encoding"))
                if self.command == "PUT" and body is not None \
                        and "Transfer-Encoding" not in self.headers:
                    with lock:
                        proxy.put_crc32[self.path] = _crc32(body)
                return body

            def _upstream(self, body: bytes | None,
                          fault: Fault) -> tuple[http.client.HTTPResponse, bytes]:
                """The server's answer to the request, read whole; its connection closed
                at once (a client that hangs up on the proxy never leaves it open)."""
                dropped = ("connection", "range") if fault == "whole" else ("connection",)
                conn = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
                try:
                    headers = {k: v for k, v in self.headers.items()
                               if k.lower() not in dropped}
                    conn.request(self.command, self.path, body=body, headers=headers)
                    answer = conn.getresponse()
                    return answer, answer.read()
                finally:
                    conn.close()

            def _handle(self) -> None:
                with lock:
                    fault = plan(len(proxy.faults), self.command, self.path,
                                 self.headers.get("Range"))
                    proxy.faults.append(fault)
                    if self.command == "GET":
                        proxy.gets.append((self.path, self.headers.get("Range")))
                    if self.command == "PUT":
                        proxy.puts.append((self.path, {k.lower(): v
                                                       for k, v in self.headers.items()}))
                if self._before_body(fault):
                    return
                body = self._request_body()
                if fault == "reset":
                    self.close_connection = True
                    self.connection.close()
                    return
                if fault in ("slowdown", "forbidden"):
                    self._error(*((503, SLOWDOWN) if fault == "slowdown" else (403, FORBIDDEN)))
                    return
                answer, data = self._upstream(body, fault)
                listing = fault == "size" and "list-type=" in self.path
                data = _larger_sizes(data) if listing else data
                self.send_response(answer.status, answer.reason)
                for name, value in answer.getheaders():
                    if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(name, _wrong_total(value) if fault == "total"
                                         and name.lower() == "content-range" else value)
                # a HEAD's Content-Length is the object's size, not the (empty) body's
                self.send_header("Content-Length", _head_length(answer, fault)
                                 if self.command == "HEAD" else str(len(data)))
                self.end_headers()
                self._body(data, fault)

            def _body(self, data: bytes, fault: Fault) -> None:
                """The answer's body, as *fault* sends it."""
                if fault == "cut" and len(data) > 1:
                    self.wfile.write(data[: len(data) // 2])
                    self.close_connection = True
                    self.connection.close()
                elif fault == "hold" and len(data) > 1:
                    sent = len(data) // 2
                    self.wfile.write(data[:sent])
                    self.wfile.flush()
                    proxy.holding.set()
                    while not proxy.released.wait(0.5) and sent < len(data) - 1:
                        try:
                            self.wfile.write(data[sent:sent + 1])
                            self.wfile.flush()
                        except OSError:
                            break  # the client went away
                        sent += 1
                    self.close_connection = True
                    self.connection.close()
                elif fault == "pause" and len(data) > 1:
                    self._pause(data)
                elif fault == "flip" and self.command == "GET" and data:
                    middle = len(data) // 2
                    self.wfile.write(data[:middle] + bytes([data[middle] ^ 0xFF])
                                     + data[middle + 1:])
                elif self.command != "HEAD":
                    self.wfile.write(data)

            def _pause(self, data: bytes) -> None:
                """Send the first half of *data*, set `holding`, and the rest once `resume`
                is set (or nothing more, once the proxy closes)."""
                half = len(data) // 2
                self.wfile.write(data[:half])
                self.wfile.flush()
                proxy.holding.set()
                while not proxy.resume.wait(0.1):
                    if proxy.released.is_set():
                        self.close_connection = True
                        self.connection.close()
                        return
                self.wfile.write(data[half:])

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _handle  # noqa: N815

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        if tls is not None:
            self._server.socket = tls.wrap_socket(self._server.socket, server_side=True)
        scheme = "https" if tls is not None else "http"
        self.endpoint_url = f"{scheme}://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def ranges(self) -> list[str | None]:
        """Every GET's Range header, in the order the GETs came."""
        return [wanted for _path, wanted in self.gets]

    def __enter__(self) -> FaultyProxy:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.released.set()
        self._server.shutdown()
        self._server.server_close()
