"""Ranged GETs over plain http whose bodies the kernel moves from the socket to the file.

On an http:// endpoint (MinIO, Ceph RGW or another S3 on the cluster's own network, a test
server) every byte through obstore is copied twice in the client: from the socket into a
buffer obstore gathers, then from that buffer, no longer in the CPU's cache, into the page
cache; that second copy was most of what kept fetch behind s5cmd (bench/README.md, "where
s5cmd's lead is"). Here a ranged GET is sent on a kept-alive connection of our own, and its
body goes socket → pipe → file with splice(2): the kernel hands the socket's pages to the
pipe and copies them once, into the page cache at the part's offset, with no Python per byte
(each call moves up to a pipe's worth, 1 MiB, with the GIL released, once the socket has
gathered GATHER_BYTES of it).

Only the plain case is taken here: a 206 whose Content-Range and Content-Length are the
bytes asked for. The URL is signed by obstore's store (the same credentials, endpoint and
region as its own GETs). Anything else (another status, a refused or reset connection, a
body cut off, no byte for a minute) ends the attempt with what has landed so far, and the
caller (`RangeReader.read_into`) goes on from that byte through obstore, whose retries,
backoff and errors are the store's; a status that says the server will not take these
requests (a 403, a 200 that ignored the Range) turns this path off for the store.

Not used over https (TLS is decrypted in user space, so there is nothing to splice), through
an HTTP proxy (the environment names one), off Linux, or with ENGINECTL_S3_SPLICE=0.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import socket
import struct
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Final
from urllib.parse import urlsplit

from registry.store.base import check_stop
from registry.store.ranges import pwrite_all

PIPE_BYTES: Final = 1 << 20
"""What one splice moves at most (a pipe grown to 1 MiB, Linux's default pipe-max-size)."""
GATHER_BYTES: Final = 512 << 10
"""How much of a body the socket gathers before a splice moves it (SO_RCVLOWAT, waited for
with poll): a splice moves what has arrived, ~70-450 KiB a call against a local server, and
each call is a turn of Python and of the GIL between eight threads; waiting for half a pipe
halved the calls and the context switches, and took ~10 % off the client's CPU
(bench/README.md, fetch_s3.py 2026-12-06). A link that brings less than this in READ_TIMEOUT
goes on through obstore, as a stalled one does."""
HEAD_LIMIT: Final = 64 << 10
"""Response headers longer than this are not S3's: the attempt ends there."""
CONNECT_TIMEOUT: Final = 10.0
READ_TIMEOUT: Final = 60
"""Seconds with no byte before a body is given up (botocore's read timeout)."""
F_SETPIPE_SZ: Final = 1031  # fcntl.h; Python's fcntl module names it from 3.10 on Linux
PROXY_VARIABLES: Final = ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
KEPT: Final = frozenset({206, 404, 429, 500, 502, 503, 504})
"""Statuses that say nothing against these requests (a missing key, or ones obstore retries:
the server will answer later); any other turns the path off."""


def usable(endpoint: str | None, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the GETs of *endpoint* can take this path."""
    return bool(
        endpoint
        and endpoint.startswith("http://")
        and hasattr(os, "splice")
        and environ.get("ENGINECTL_S3_SPLICE", "1").strip() != "0"
        and not any(environ.get(name) for name in PROXY_VARIABLES)
    )


class Connection:
    """One kept-alive HTTP/1.1 connection and (unless *pipe* is False) the pipe its bodies
    pass through.

    Its socket and pipe are closed by `close`, or else when the connection is collected,
    by a `weakref.finalize` that holds them: not by `__del__`, because a store is collected
    in a reference cycle, and the collector may finalize the socket before the connection
    that owns it (one younger than the other in the collector's generations), which then
    goes out unclosed (an "unclosed socket" ResourceWarning, an error under pytest)."""

    def __init__(self, host: str, port: int, *, pipe: bool = True) -> None:
        self.host, self.port = host, port
        self.read_end = self.write_end = -1
        sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT)
        try:
            sock.settimeout(None)  # blocking, so that splice waits; SO_RCVTIMEO bounds it
            wait = struct.pack("ll", READ_TIMEOUT, 0)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, wait)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, wait)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if pipe:
                self.read_end, self.write_end = os.pipe()
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        self._closer = weakref.finalize(self, _close, sock, (self.read_end, self.write_end))
        if pipe:
            with contextlib.suppress(OSError):  # a smaller pipe only means more calls
                import fcntl

                fcntl.fcntl(self.write_end, F_SETPIPE_SZ, PIPE_BYTES)

    def close(self) -> None:
        """Idempotent: the socket and the pipe's descriptors are closed once (their numbers
        may be reused)."""
        self._closer()
        self.read_end = self.write_end = -1


def _close(sock: socket.socket, fds: tuple[int, int]) -> None:
    sock.close()
    for fd in fds:
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)


class Answer:
    """The status line and headers of a response, read off the socket and no further."""

    def __init__(self, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        self.status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
        self.headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name:
                self.headers[name.strip().lower()] = value.strip()

    def body_range(self) -> tuple[int, int, int] | None:
        """(first, last + 1, total) of a 206's Content-Range; None when it has none."""
        value = self.headers.get("content-range", "")
        unit, _, spec = value.partition(" ")
        span, _, total = spec.partition("/")
        first, _, last = span.partition("-")
        if unit != "bytes" or not (first.isdigit() and last.isdigit() and total.isdigit()):
            return None
        return int(first), int(last) + 1, int(total)


def read_head(sock: socket.socket) -> bytes | None:
    """The response's head up to its blank line, taking no byte of the body off the socket
    (peeked, then only the head consumed); None when the connection ends first."""
    head = b""
    while len(head) < HEAD_LIMIT:
        peeked = sock.recv(HEAD_LIMIT, socket.MSG_PEEK)
        if not peeked:
            return None
        seen = head + peeked
        end = seen.find(b"\r\n\r\n", max(0, len(head) - 3))
        take = len(peeked) if end < 0 else end + 4 - len(head)
        head += sock.recv(take, socket.MSG_WAITALL)
        if end >= 0:
            return head
    return None


class Connections:
    """Connections kept between requests (closed when collected); thread-safe."""

    def __init__(self, *, pipe: bool) -> None:
        self._pipe = pipe
        self._idle: list[Connection] = []
        self._lock = threading.Lock()

    def take(self, host: str, port: int) -> tuple[Connection, bool]:
        """An idle connection to host:port (True: it was used before), else a new one."""
        with self._lock:
            for i, connection in enumerate(self._idle):
                if (connection.host, connection.port) == (host, port):
                    return self._idle.pop(i), True
        return Connection(host, port, pipe=self._pipe), False

    def give_back(self, connection: Connection, answer: Answer) -> None:
        """Keep *connection* for the next request unless *answer* said it closes."""
        if answer.headers.get("connection", "").lower() == "close":
            connection.close()
        else:
            with self._lock:
                self._idle.append(connection)


class Splicer:
    """Ranged GETs spliced into files, on connections kept between GETs; thread-safe.

    *sign(key)* gives a presigned GET URL of *key*."""

    def __init__(self, sign: Callable[[str], str]) -> None:
        self._sign = sign
        self._connections = Connections(pipe=True)
        self.on = True

    def get(self, key: str, fd: int, byte_range: tuple[int, int], *,
            stop: threading.Event | None, landed: Callable[[int], None],
            size: int | None = None) -> tuple[int, int | None]:
        """Splice the bytes in [start, end) of *key* into *fd* at their offsets; return how
        many landed (from *start*, in order; `landed(n)` is told of each piece) and the
        object's size (None when no body started). Fewer than asked: the caller asks
        for the rest another way. An answer whose Content-Range total is not *size* (the
        size the caller knows) is left unread, the path staying on: one answer's fault.
        An error writing *fd* (a full disk) is raised."""
        start, end = byte_range
        try:
            url = urlsplit(self._sign(key))
        except Exception:  # noqa: BLE001 - no credentials to sign with: obstore's GET says why
            return 0, None
        host, port = url.hostname or "", url.port or 80
        request = (f"GET {url.path}?{url.query} HTTP/1.1\r\nHost: {url.netloc}\r\n"
                   f"Range: bytes={start}-{end - 1}\r\nUser-Agent: enginectl\r\n\r\n").encode()
        for _attempt in range(2):  # a kept connection the server has since closed: once more
            check_stop(stop)
            try:
                connection, reused = self._connections.take(host, port)
            except OSError:
                return 0, None
            try:
                connection.sock.sendall(request)
                head = read_head(connection.sock)
            except OSError:
                head = None
            if head is None:
                connection.close()
                if reused:
                    continue
                return 0, None
            return self._body(connection, Answer(head), fd, byte_range, stop=stop,
                              landed=landed, size=size)
        return 0, None

    def _body(self, connection: Connection, answer: Answer, fd: int,
              byte_range: tuple[int, int], *, stop: threading.Event | None,
              landed: Callable[[int], None], size: int | None) -> tuple[int, int | None]:
        start, end = byte_range
        span = answer.body_range()
        length = answer.headers.get("content-length", "")
        if answer.status != 206 or span is None or span[:2] != (start, end) \
                or length != str(end - start) or "transfer-encoding" in answer.headers:
            if answer.status not in KEPT or answer.status == 206:
                self.on = False  # the server does not take these requests as obstore's
            connection.close()
            return 0, None
        if size is not None and span[2] != size:  # obstore asks again, and judges
            connection.close()
            return 0, None
        done = 0
        sock = connection.sock
        waiting = select.poll()
        waiting.register(sock, select.POLLIN)
        asked = 1
        try:
            while done < end - start:
                check_stop(stop)
                try:
                    want = min(GATHER_BYTES, end - start - done)
                    if want != asked:  # never more than is left: the body's end wakes it
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, want)
                        asked = want
                    if not waiting.poll(READ_TIMEOUT * 1000):
                        raise TimeoutError
                    moved = os.splice(sock.fileno(), connection.write_end,
                                      min(end - start - done, PIPE_BYTES))
                except OSError:
                    moved = 0  # reset, or no byte for READ_TIMEOUT: the caller resumes
                if moved == 0:
                    connection.close()
                    return done, span[2]
                done += self._to_file(connection, fd, start + done, moved, landed)
            if asked != 1:  # the next answer's head is read with recv, which waits for it
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)
        except BaseException:
            connection.close()
            raise
        self._connections.give_back(connection, answer)
        return done, span[2]

    def _to_file(self, connection: Connection, fd: int, offset: int, size: int,
                 landed: Callable[[int], None]) -> int:
        """Move *size* bytes from the connection's pipe to *fd* at *offset*. A file system
        that takes no splice (EINVAL) gets them copied, and the path turns itself off; any
        other error of the disk (a full one) is raised as it is."""
        left = size
        while left:
            try:
                written = os.splice(connection.read_end, fd, left, offset_dst=offset)
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOSYS):
                    raise
                self.on = False
                written = len(data := os.read(connection.read_end, left))
                pwrite_all(fd, data, offset)
            offset, left = offset + written, left - written
            landed(written)
        return size
