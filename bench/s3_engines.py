"""Which engine should move fetch's bytes: boto3, awscrt or obstore, on the same server and run.

Starts s3rver on 127.0.0.1, puts N objects of M MiB of random bytes (8 × 256 MiB), then, in
interleaved rounds (median of ROUNDS), each case in its own process (wall, client CPU and
peak RSS of that process, start-up included; the server's CPU beside it), every case writing
all objects into files and checking their xxh3-128:

  ours-splice    enginectl's S3Store download path as shipped over http: one pool of ranged
                 GETs of `download_part_size` (32 MiB), each body spliced by the kernel from
                 the socket to its file offset (`registry.store.s3splice`), hashed in order
                 as the parts complete, read back through one 256 KiB buffer per blob
  ours-obstore   the same with ENGINECTL_S3_SPLICE=0: obstore streams the bodies in 1 MiB
                 chunks that Python writes (what https always takes)
  ours-boto3     the same path with boto3 moving the bytes (what enginectl did before)
  crt-onbody     awscrt's S3Client (aws-cli v2's and s3transfer's CRT engine): one meta
                 request per object, its own ranged parts, bytes delivered in order to a
                 Python callback that writes and hashes them
  crt-file       awscrt writing the objects itself (`recv_filepath`), hashed afterwards
  obstore-raw    obstore without enginectl: 16 threads of ranged streams, hashed afterwards
  s5cmd          `s5cmd cp` (Go), hashed afterwards
  ceiling        8 `curl -o /dev/null` at once: what the server can send, nothing written

awscrt is not a dependency of enginectl: the crt cases run when `import awscrt` works
(`.venv/bin/pip install awscrt==0.38.0` to include them) and say so when not.
Run: `.venv/bin/python bench/s3_engines.py [--rounds 3] [--files 8 --file-mib 256]`
(≈5 minutes; about 3 GiB of temp disk).
`--quick`: one round of 2 × 1 MiB on moto, to check the script runs (the suite does).
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import shutil
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from _support import (
    MiB,
    Sample,
    add_quick,
    loadavg,
    log,
    machine,
    median,
    process_cpu,
    quick_mode,
    rmtree,
    run_measured,
    s3_server,
    s5cmd_bin,
    scratch,
    write_random,
)

CASES = ("ours-splice", "ours-obstore", "ours-boto3", "crt-onbody", "crt-file", "obstore-raw",
         "s5cmd", "ceiling")


def xxh3_of(path: Path) -> str:
    import xxhash

    with path.open("rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as m:
        return str(xxhash.xxh3_128(m).hexdigest())


class Boto3Reader:
    """`RangeReader.read_into` with boto3's streaming read (`Bucket.read_into`, what the
    reader replaced) moving the bytes."""

    splices = False  # boto3 moves the bodies itself: the store sizes its threads for that

    def __init__(self, bucket: Any) -> None:
        self.bucket = bucket

    def read_into(self, key: str, what: str, fd: int, byte_range: tuple[int, int], *,
                  size: int | None = None, stop: Any = None,
                  landed: Callable[[int], None] | None = None) -> int:
        del size  # the object's size the caller knows: boto3's answer says it
        from registry.store.ranges import pwrite_all

        def write(offset: int, chunk: bytes) -> None:
            pwrite_all(fd, chunk, offset)
            if landed is not None:
                landed(len(chunk))

        return int(self.bucket.read_into(key, what, write, byte_range, stop))


def ours(job: dict[str, Any], out: Path, *, boto3_bytes: bool) -> None:
    from registry.identity.digest import Digest
    from registry.store.s3store import S3Store

    store = S3Store(job["bucket"], endpoint_url=job["endpoint"])
    if boto3_bytes:
        store.__dict__["_reader"] = Boto3Reader(store.bucket)

    def one(key: str) -> None:
        fd = os.open(out / key, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            got = store._download(key, key, fd, job["size"], progress=None, stop=None,
                                  digest=Digest("xxh3-128", job["xxh3"]))
        finally:
            os.close(fd)
        assert got.hex == job["xxh3"], got

    with ThreadPoolExecutor(len(job["keys"])) as pool:
        list(pool.map(one, job["keys"]))


def crt(job: dict[str, Any], out: Path, *, to_file: bool) -> None:
    import xxhash
    from awscrt import auth, http, io, s3

    loop = io.EventLoopGroup()
    bootstrap = io.ClientBootstrap(loop, io.DefaultHostResolver(loop))
    credentials = auth.AwsCredentialsProvider.new_static(job["key_id"], job["secret"])
    client = s3.S3Client(bootstrap=bootstrap, region="us-east-1",
                         signing_config=s3.create_default_s3_signing_config(
                             region="us-east-1", credential_provider=credentials),
                         tls_mode=s3.S3RequestTlsMode.DISABLED, part_size=16 * MiB,
                         memory_limit=256 * MiB)  # its part buffers: enginectl's RSS budget
    host = job["endpoint"].split("://", 1)[1]
    requests = []
    for key in job["keys"]:
        request = http.HttpRequest("GET", f"/{job['bucket']}/{key}",
                                   http.HttpHeaders([("Host", host)]))
        if to_file:
            requests.append((key, None, client.make_request(
                type=s3.S3RequestType.GET_OBJECT, request=request, recv_filepath=str(out / key))))
            continue
        fd = os.open(out / key, os.O_RDWR | os.O_CREAT, 0o644)
        hasher = xxhash.xxh3_128()

        def on_body(chunk: Any, offset: int, fd: int = fd, hasher: Any = hasher,
                    **_: Any) -> None:
            os.pwrite(fd, chunk, offset)
            hasher.update(chunk)

        requests.append((key, (fd, hasher), client.make_request(
            type=s3.S3RequestType.GET_OBJECT, request=request, on_body=on_body)))
    for key, streamed, request in requests:
        request.finished_future.result()
        if streamed is None:
            assert xxh3_of(out / key) == job["xxh3"]
        else:
            os.close(streamed[0])
            assert streamed[1].hexdigest() == job["xxh3"]


def obstore_raw(job: dict[str, Any], out: Path) -> None:
    import obstore
    from obstore.store import S3Store

    store = S3Store(job["bucket"], endpoint=job["endpoint"], access_key_id=job["key_id"],
                    secret_access_key=job["secret"], region="us-east-1",
                    client_options={"allow_http": True})
    part, size = 16 * MiB, job["size"]
    fds = {key: os.open(out / key, os.O_RDWR | os.O_CREAT, 0o644) for key in job["keys"]}

    def one(item: tuple[str, int]) -> None:
        key, offset = item
        result = obstore.get(store, key, options={"range": (offset, min(offset + part, size))})
        for chunk in result.stream(min_chunk_size=MiB):
            os.pwrite(fds[key], chunk, offset)
            offset += len(chunk)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, [(k, o) for k in job["keys"] for o in range(0, size, part)]))
    for key, fd in fds.items():
        os.close(fd)
        assert xxh3_of(out / key) == job["xxh3"]


def child(job: dict[str, Any], case: str, out: Path) -> None:
    out.mkdir()
    runners: dict[str, Callable[[], None]] = {
        "ours-splice": lambda: ours(job, out, boto3_bytes=False),
        "ours-obstore": lambda: ours(job, out, boto3_bytes=False),
        "ours-boto3": lambda: ours(job, out, boto3_bytes=True),
        "crt-onbody": lambda: crt(job, out, to_file=False),
        "crt-file": lambda: crt(job, out, to_file=True),
        "obstore-raw": lambda: obstore_raw(job, out),
    }
    runners[case]()


def main() -> None:  # noqa: PLR0915 - one linear script reads best
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--file-mib", type=int, default=256)
    parser.add_argument("--case", help=argparse.SUPPRESS)  # a child runs one case
    parser.add_argument("--job", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    add_quick(parser)
    args = parser.parse_args()
    if quick_mode(args.quick):
        args.rounds, args.files, args.file_mib = 1, 2, 1
    if args.case:
        child(json.loads(args.job), args.case, Path(args.out))
        return

    print(f"machine: {machine()}")
    try:
        import awscrt  # noqa: F401 - only whether it is there
        cases = list(CASES)
    except ImportError:
        print("not measured: crt-onbody, crt-file (`.venv/bin/pip install awscrt==0.38.0`)")
        cases = [c for c in CASES if not c.startswith("crt")]
    with scratch("enginectl-s3-engines-") as tmp, s3_server(tmp) as server:
        print(f"server: {server.kind} at {server.endpoint_url}")
        bucket, client = server.create_bucket(), server.client()
        size = args.file_mib * MiB
        source = tmp / "object.bin"
        write_random(source, size)
        keys = [f"object-{i:02d}" for i in range(args.files)]
        for key in keys:
            client.upload_file(str(source), bucket, key)
        job = {"bucket": bucket, "endpoint": server.endpoint_url, "keys": keys, "size": size,
               "xxh3": xxh3_of(source), "key_id": server.env["AWS_ACCESS_KEY_ID"],
               "secret": server.env["AWS_SECRET_ACCESS_KEY"]}
        source.unlink()
        s5cmd = s5cmd_bin()
        urls = [client.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": k},
                                              ExpiresIn=24 * 3600) for k in keys]
        env = {**server.env, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}

        def run_case(case: str, out: Path) -> Sample:
            if case == "s5cmd":
                assert s5cmd is not None
                sample = run_measured([str(s5cmd), "--endpoint-url", server.endpoint_url, "cp",
                                       f"s3://{bucket}/object-*", f"{out}/"], env)
                assert all(xxh3_of(out / key) == job["xxh3"] for key in keys)
                return sample
            if case == "ceiling":
                script = ("import subprocess,sys;ps=[subprocess.Popen(['curl','-sf','-o',"
                          "'/dev/null',u]) for u in sys.argv[1:]];"
                          "sys.exit(max(p.wait() for p in ps))")
                return run_measured([sys.executable, "-c", script, *urls], env)
            splice = {"ENGINECTL_S3_SPLICE": "1" if case == "ours-splice" else "0"}
            return run_measured([sys.executable, __file__, "--case", case, "--job",
                                 json.dumps(job), "--out", str(out)], {**env, **splice})

        if s5cmd is None:
            cases.remove("s5cmd")
        if shutil.which("curl") is None:
            cases.remove("ceiling")
        samples: dict[str, list[Sample]] = {case: [] for case in cases}
        server_cpu: dict[str, list[float]] = {case: [] for case in cases}
        loads = []
        for i in range(args.rounds):
            for case in cases:
                out = tmp / f"out-{case}"
                os.sync()
                loads.append(loadavg())
                log(f"round {i + 1}/{args.rounds}: {case} (load {loads[-1]})")
                before = process_cpu(server.process.pid)
                samples[case].append(run_case(case, out))
                server_cpu[case].append(process_cpu(server.process.pid) - before)
                rmtree(out)
        total = size * len(keys)
        base = median([x.seconds for x in samples["ours-splice"]])
        print(f"\n{len(keys)} × {args.file_mib} MiB; median of {args.rounds} rounds; each case "
              f"a process (start-up included); ratio = time / time of ours-splice; load "
              f"average at the starts {loads[0]} … {loads[-1]}, at the end {loadavg()}\n")
        print(f"{'case':<13} {'median s':>8} {'MB/s':>5} {'ratio':>5} {'CPU s':>5} "
              f"{'server':>6} {'peak RSS':>9}  runs (s)")
        for case, values in samples.items():
            wall = median([x.seconds for x in values])
            rss = max((x.rss_mib for x in values if x.rss_mib is not None), default=None)
            shown = f"{rss:.0f} MiB" if rss is not None else "-"
            print(f"{case:<13} {wall:8.2f} {total / wall / 1e6:5.0f} {wall / base:5.2f} "
                  f"{median([x.cpu for x in values]):5.1f} {median(server_cpu[case]):6.1f} "
                  f"{shown:>9}  {', '.join(f'{x.seconds:.1f}' for x in values)}")


if __name__ == "__main__":
    main()
