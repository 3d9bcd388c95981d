"""Multipart parts over plain http whose bodies the kernel sends from the file.

boto3 sends a part from a buffer it was read into: one part-sized buffer per part in flight
(8 × 64 MiB), faulted in and zeroed by the kernel for every import, then copied once more
into the socket. On the VMs measured that was a quarter of an import's CPU (bench/README.md,
upload). Over an http:// endpoint (MinIO, Ceph RGW or another S3 on the cluster's own
network, a test server) nothing is encrypted in user space, so here a part goes out
differently: its CRC32 is computed from the file in small reads into one reused buffer, the
UploadPart request is presigned by boto3's client with that CRC32 as a signed header (S3
checks the bytes against it, as it does for boto3's own PUTs, and the header cannot be
swapped), and sendfile(2) moves the body from the page cache to the socket: no part buffer,
no byte through Python.

Only the plain case is taken here: a 200 with an ETag. Anything else (another status, a
refused or reset connection, the file ending early, no progress for a minute) ends the
attempt, and the caller sends the part through boto3, whose retries, backoff and errors are
the store's; a status that says the server will not take these requests (any but 404 and
those boto3 retries) turns this path off for the store.

Used where fetch's GETs are spliced (`s3splice.usable`: plain http, no proxy named in the
environment, Linux, ENGINECTL_S3_SPLICE not 0).
"""

from __future__ import annotations

import base64
import os
import threading
import zlib
from typing import Final
from urllib.parse import urlsplit

from registry.store.base import check_stop
from registry.store.s3splice import KEPT, Answer, Connection, Connections, read_head

CRC_READ: Final = 1 << 20
"""Bytes read per step to compute a part's CRC32 (into one buffer, hashed while in cache)."""
SEND_STEP: Final = 8 << 20
"""The most one sendfile call moves, so that a stop is seen between steps."""
ANSWER_LIMIT: Final = 64 << 10
"""A 200 to a part PUT has no body worth the name; a longer one is not S3's."""


def crc32_of(fd: int, byte_range: tuple[int, int]) -> str:
    """The CRC32 of bytes [start, end) of *fd*, as S3 writes it (base64 of 4 big-endian
    bytes). A file shorter than *end* raises EOFError."""
    start, end = byte_range
    buffer = bytearray(min(CRC_READ, max(1, end - start)))
    crc, offset = 0, start
    with memoryview(buffer) as view:
        while offset < end:
            got = os.preadv(fd, [view[: min(len(buffer), end - offset)]], offset)
            if got == 0:
                raise EOFError(f"file ends at byte {offset}, before {end}")
            crc = zlib.crc32(view[:got], crc)
            offset += got
    return base64.b64encode(crc.to_bytes(4, "big")).decode("ascii")


class Sender:
    """Part PUTs sent from files, on connections kept between PUTs; thread-safe."""

    def __init__(self) -> None:
        self._connections = Connections(pipe=False)
        self.on = True

    def put(self, url: str, fd: int, byte_range: tuple[int, int], crc: str, *,
            stop: threading.Event | None) -> dict[str, str] | None:
        """PUT bytes [start, end) of *fd* to the presigned *url* (signed with *crc* as its
        `x-amz-checksum-crc32` header); the part's ETag (and the CRC32 S3 checked, when it
        says) on a 200, else None: the caller sends the part another way."""
        start, end = byte_range
        parts = urlsplit(url)
        host, port = parts.hostname or "", parts.port or 80
        request = (f"PUT {parts.path}?{parts.query} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
                   f"Content-Length: {end - start}\r\nx-amz-checksum-crc32: {crc}\r\n"
                   "User-Agent: enginectl\r\n\r\n").encode()
        for _attempt in range(2):  # a kept connection the server has since closed: once more
            check_stop(stop)
            try:
                connection, reused = self._connections.take(host, port)
            except OSError:
                return None
            sent = False
            try:
                connection.sock.sendall(request)
                self._send_body(connection.sock.fileno(), fd, byte_range, stop)
                sent = True
                head = read_head(connection.sock)
            except (BrokenPipeError, ConnectionResetError):
                self._refused_early(connection)
                head = None
            except (OSError, EOFError):  # EOFError: the file is shorter than it was
                head = None
            except BaseException:
                connection.close()
                raise
            if head is None:
                connection.close()
                if reused and not sent:  # a kept connection that failed: once more, afresh
                    continue
                return None
            return self._answer(connection, Answer(head))
        return None

    def _refused_early(self, connection: Connection) -> None:
        """A server that answered before it took the body (S3 does, refusing a request)
        and closed: an answer that says it will not take these PUTs turns the path off."""
        try:
            head = read_head(connection.sock)  # the connection is closed: this cannot wait
        except OSError:
            return
        if head is not None and Answer(head).status not in KEPT:
            self.on = False

    @staticmethod
    def _send_body(sock: int, fd: int, byte_range: tuple[int, int],
                   stop: threading.Event | None) -> None:
        """Send the bytes from the file, SEND_STEP at most per call. A file that ends early
        raises EOFError, a connection that fails OSError: the caller sends the part another
        way, which reports a file that changed."""
        start, end = byte_range
        offset = start
        while offset < end:
            check_stop(stop)
            moved = os.sendfile(sock, fd, offset, min(end - offset, SEND_STEP))
            if moved == 0:
                raise EOFError(f"file ends at byte {offset}, before {end}")
            offset += moved

    def _answer(self, connection: Connection, answer: Answer) -> dict[str, str] | None:
        length = answer.headers.get("content-length", "")
        etag = answer.headers.get("etag")
        if answer.status != 200 or etag is None or not length.isdigit() \
                or int(length) > ANSWER_LIMIT or "transfer-encoding" in answer.headers:
            if answer.status == 206 or answer.status not in KEPT:  # 200: a malformed one
                self.on = False  # the server does not take these requests as boto3's
            connection.close()
            return None
        left = int(length)
        try:
            while left:
                got = connection.sock.recv(left)
                if not got:
                    raise ConnectionResetError
                left -= len(got)
        except OSError:
            connection.close()  # the part was taken (a 200); only the connection is lost
        else:
            self._connections.give_back(connection, answer)
        part = {"ETag": etag}
        checked = answer.headers.get("x-amz-checksum-crc32")
        if checked is not None:
            part["ChecksumCRC32"] = checked
        return part
