"""Multipart upload of one blob to S3: parts of `part_size` run on one pool of `threads`
shared by all the blobs of a publish, each part read from the file only when it is sent (over
plain http sent by the kernel from the file, `registry.store.s3sendfile`; else read into a
reused buffer for boto3); every part carries a CRC32 checksum that S3 checks, and the upload
is aborted on any failure or stop. (Not s3transfer's manager: its threads hold the process
until every part in flight is sent, so a Ctrl-C'd publish could not stop.)

`registry.store.s3store.S3Store` decides when a blob is large enough for this; boto3 is
loaded by then (the store's `Bucket` is).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Mapping
from functools import cached_property
from typing import TYPE_CHECKING, Any, Final

from registry.store.base import Progress, check_stop
from registry.store.ranges import PartBuffers, read_exactly_into, split
from registry.workers import Workers

if TYPE_CHECKING:
    from registry.store.s3bucket import Bucket
    from registry.store.s3sendfile import Sender

PRESIGNED_FOR: Final = 15 * 60
"""Seconds a part's presigned PUT is good for (it is sent at once)."""


class Uploader:
    """The multipart uploads of one S3 store; safe to share between threads."""

    def __init__(self, bucket: Bucket, *, endpoint_url: str | None, threads: int,
                 part_size: int) -> None:
        self.bucket = bucket
        self.endpoint_url = endpoint_url
        self.threads = threads
        self.part_size = part_size

    @cached_property
    def _writers(self) -> Workers:
        """The part uploads of every blob this store publishes share these threads (each
        holds one part in memory while it sends it). Daemon threads: a stopped publish never
        waits for a part still in flight."""
        return Workers(self.threads, name="s3-put")

    @cached_property
    def _part_buffers(self) -> PartBuffers:
        """One reused buffer per part in flight, freed when no upload is (`PartBuffers`)."""
        return PartBuffers(self.part_size)

    @cached_property
    def _sender(self) -> Sender | None:
        """The plain-http path for part bodies (`registry.store.s3sendfile`), where it can be
        used."""
        from registry.store import s3sendfile, s3splice

        return s3sendfile.Sender() if s3splice.usable(self.endpoint_url) else None

    def _send_from_file(self, key: str, upload_id: str, number: int, fd: int,
                        byte_range: tuple[int, int], *,
                        stop: threading.Event | None) -> dict[str, str] | None:
        """The part sent by the kernel from the file; None when that path is off or the
        attempt did not get through (boto3 then sends it, and reports what went wrong)."""
        sender = self._sender
        if sender is None or not sender.on:
            return None
        from registry.store.s3sendfile import crc32_of

        try:
            crc = crc32_of(fd, byte_range)
        except (OSError, EOFError):
            return None  # boto3's read of the part says what is wrong with the file
        url = self.bucket.presign_part(key, upload_id, number, crc, PRESIGNED_FOR)
        return sender.put(url, fd, byte_range, crc, stop=stop)

    def upload(self, key: str, fd: int, size: int, part_size: int, *,
               progress: Progress | None, stop: threading.Event | None) -> None:
        """One multipart upload of *size* bytes of *fd* in parts of *part_size*, with a CRC32
        checksum per part (S3 checks each), parts read from the file only when their turn
        comes; aborted on any failure or stop."""
        from botocore.exceptions import BotoCoreError, ClientError  # boto3 is loaded by now

        client, bucket = self.bucket.client, self.bucket.name
        upload_id = client.create_multipart_upload(
            Bucket=bucket, Key=key, ChecksumAlgorithm="CRC32")["UploadId"]

        def send(number: int, start: int, end: int) -> dict[str, Any]:
            check_stop(stop)
            answer: Mapping[str, Any] | None = self._send_from_file(
                key, upload_id, number, fd, (start, end), stop=stop)
            if answer is None:
                with self._part_buffers.lend(end - start) as data:
                    read_exactly_into(fd, start, data)
                    # botocore takes a bytearray as a blob (validate.py); its stubs say bytes
                    answer = client.upload_part(
                        Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number,
                        Body=data, ChecksumAlgorithm="CRC32")  # type: ignore[arg-type]
            if progress is not None:
                progress(end - start)
            part: dict[str, Any] = {"PartNumber": number, "ETag": answer["ETag"]}
            if "ChecksumCRC32" in answer:  # S3 checked it; a server that ignores flexible
                part["ChecksumCRC32"] = answer["ChecksumCRC32"]  # checksums (s3rver) omits it
            return part

        ranges = split(0, size, part_size)
        futures = [self._writers.submit(send, n, *r) for n, r in enumerate(ranges, start=1)]
        try:
            parts = [future.result() for future in futures]
            client.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id,
                                             MultipartUpload={"Parts": parts})  # type: ignore[typeddict-item]
        except BaseException:
            for future in futures:
                future.cancel()
            with contextlib.suppress(ClientError, BotoCoreError):
                client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
            raise

