"""A minimal S3 endpoint that throws big bodies away: an upload bench's server that is not the
bottleneck.

s3rver spends 3–4 CPU-seconds per GiB it receives (and more than one core), so on a 2-vCPU
machine every upload bench measured s3rver, not the clients. This server keeps what is
small (≤ 1 MiB: manifests, records) in memory and, for anything bigger, reads the body into
one reused buffer and keeps only its size: what it costs per byte is the kernel's socket
copy. It answers the calls an upload makes — create/HEAD bucket, PUT, HEAD, GET (small
objects), DELETE and copy of an object, ListObjectsV2, and the multipart calls — with the
headers and XML S3 sends, and checks no signature. Not S3: a bench tool only, never a test
server (the tests use moto).

Run: `python bench/s3sink.py --port N` (127.0.0.1 only; stops on SIGTERM).
"""

from __future__ import annotations

import argparse
import hashlib
import signal
import sys
import threading
import uuid
from dataclasses import dataclass
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit
from xml.sax.saxutils import escape

KEPT = 1 << 20
"""Bodies up to this size are kept (and can be read back); bigger ones are counted only."""
BUFFER = memoryview(bytearray(1 << 20))  # shared: what is read into it is never looked at


@dataclass
class Entry:
    size: int
    etag: str
    data: bytes | None  # None: thrown away
    modified: str


class Sink:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.buckets: set[str] = set()
        self.objects: dict[tuple[str, str], Entry] = {}
        self.uploads: dict[str, dict[int, int]] = {}  # upload id → part number → size


def _xml(tag: str, inner: str, *, namespace: bool = True) -> bytes:
    """An S3 answer's XML document (S3's error documents carry no namespace)."""
    xmlns = ' xmlns="http://s3.amazonaws.com/doc/2006-03-01/"' if namespace else ""
    return f'<?xml version="1.0" encoding="UTF-8"?><{tag}{xmlns}>{inner}</{tag}>'.encode()


def handler(sink: Sink) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            del format, args

        def _answer(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
                    *, length: int | None = None) -> None:
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            if body and "Content-Type" not in (headers or {}):
                self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(body) if length is None else length))
            self.end_headers()
            if self.command != "HEAD" and body:
                self.wfile.write(body)

        def _error(self, status: int, code: str) -> None:
            self._answer(status, _xml("Error", f"<Code>{code}</Code><Message>{code}</Message>"
                                      "<RequestId>SINK</RequestId>", namespace=False))

        def _body(self) -> tuple[int, bytes | None, str]:
            """Read the request's body: its size, its bytes when small, an ETag."""
            if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                raise ValueError("chunked bodies are not taken by this sink")
            left = int(self.headers.get("Content-Length") or 0)
            if left <= KEPT:
                data = self.rfile.read(left) if left else b""
                return len(data), data, hashlib.md5(data).hexdigest()  # noqa: S324 - S3's ETag
            size = left
            while left:
                got = self.rfile.readinto(BUFFER[: min(left, len(BUFFER))])
                if not got:
                    raise ConnectionError("the body ended early")
                left -= got
            return size, None, uuid.uuid4().hex

        def _where(self) -> tuple[str, str, dict[str, list[str]]]:
            url = urlsplit(self.path)
            bucket, _, key = unquote(url.path).lstrip("/").partition("/")
            return bucket, key, parse_qs(url.query, keep_blank_values=True)

        def do_PUT(self) -> None:
            bucket, key, query = self._where()
            try:
                size, data, etag = self._body()
            except (ValueError, ConnectionError):
                self._error(400, "IncompleteBody")
                return
            if not key:
                with sink.lock:
                    sink.buckets.add(bucket)
                self._answer(200, headers={"Location": f"/{bucket}"})
                return
            echo = {k: v for k, v in self.headers.items()
                    if k.lower().startswith("x-amz-checksum-")}
            if "uploadId" in query:
                with sink.lock:
                    parts = sink.uploads.get(query["uploadId"][0])
                    if parts is None:
                        self._error(404, "NoSuchUpload")
                        return
                    parts[int(query["partNumber"][0])] = size
                self._answer(200, headers={"ETag": f'"{etag}"', **echo})
                return
            source = self.headers.get("x-amz-copy-source")
            with sink.lock:
                if self.headers.get("If-None-Match") == "*" and (bucket, key) in sink.objects:
                    self._error(412, "PreconditionFailed")
                    return
                if source:
                    src_bucket, _, src_key = unquote(source).lstrip("/").partition("/")
                    entry = sink.objects.get((src_bucket, src_key))
                    if entry is None:
                        self._error(404, "NoSuchKey")
                        return
                    sink.objects[(bucket, key)] = entry
                else:
                    entry = Entry(size, etag, data, formatdate(usegmt=True))
                    sink.objects[(bucket, key)] = entry
            if source:
                self._answer(200, _xml("CopyObjectResult", f"<ETag>&quot;{entry.etag}&quot;</ETag>"
                                       "<LastModified>2026-01-01T00:00:00.000Z</LastModified>"))
            else:
                self._answer(200, headers={"ETag": f'"{etag}"', **echo})

        def do_POST(self) -> None:
            bucket, key, query = self._where()
            self._body()
            if "uploads" in query:
                upload = uuid.uuid4().hex
                with sink.lock:
                    sink.uploads[upload] = {}
                self._answer(200, _xml("InitiateMultipartUploadResult",
                                       f"<Bucket>{escape(bucket)}</Bucket><Key>{escape(key)}"
                                       f"</Key><UploadId>{upload}</UploadId>"))
            elif "uploadId" in query:
                with sink.lock:
                    parts = sink.uploads.pop(query["uploadId"][0], None)
                    if parts is None:
                        self._error(404, "NoSuchUpload")
                        return
                    etag = f"{uuid.uuid4().hex}-{len(parts)}"
                    sink.objects[(bucket, key)] = Entry(sum(parts.values()), etag, None,
                                                        formatdate(usegmt=True))
                self._answer(200, _xml("CompleteMultipartUploadResult",
                                       f"<Bucket>{escape(bucket)}</Bucket><Key>{escape(key)}</Key>"
                                       f"<ETag>&quot;{etag}&quot;</ETag>"))
            else:
                self._error(501, "NotImplemented")

        def do_HEAD(self) -> None:
            self._get()

        def do_GET(self) -> None:
            self._get()

        def _get(self) -> None:
            bucket, key, query = self._where()
            if bucket not in sink.buckets:
                self._error(404, "NoSuchBucket")
                return
            if not key:
                if self.command == "HEAD":
                    self._answer(200)
                elif query.get("list-type") == ["2"]:
                    self._list(bucket, query.get("prefix", [""])[0])
                else:
                    self._error(501, "NotImplemented")
                return
            with sink.lock:
                entry = sink.objects.get((bucket, key))
            if entry is None:
                self._error(404, "NoSuchKey")
                return
            headers = {"ETag": f'"{entry.etag}"', "Last-Modified": entry.modified,
                       "Content-Type": "application/octet-stream"}
            if self.command == "HEAD":
                self._answer(200, headers=headers, length=entry.size)
            elif entry.data is None:
                self._error(501, "ThrownAway")  # a sink: big bodies cannot be read back
            else:
                self._answer(200, entry.data, headers)

        def _list(self, bucket: str, prefix: str) -> None:
            with sink.lock:
                found = sorted((k, e) for (b, k), e in sink.objects.items()
                               if b == bucket and k.startswith(prefix))
            contents = "".join(
                f"<Contents><Key>{escape(k)}</Key><Size>{e.size}</Size>"
                f"<ETag>&quot;{e.etag}&quot;</ETag>"
                "<LastModified>2026-01-01T00:00:00.000Z</LastModified>"
                "<StorageClass>STANDARD</StorageClass></Contents>" for k, e in found)
            self._answer(200, _xml("ListBucketResult",
                                   f"<Name>{escape(bucket)}</Name><Prefix>{escape(prefix)}</Prefix>"
                                   f"<KeyCount>{len(found)}</KeyCount><MaxKeys>1000</MaxKeys>"
                                   f"<IsTruncated>false</IsTruncated>{contents}"))

        def do_DELETE(self) -> None:
            bucket, key, query = self._where()
            with sink.lock:
                if "uploadId" in query:
                    sink.uploads.pop(query["uploadId"][0], None)
                else:
                    sink.objects.pop((bucket, key), None)
            self._answer(204)

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), handler(Sink()))
    server.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    server.serve_forever()


if __name__ == "__main__":
    main()
