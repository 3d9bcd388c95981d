"""Is the load generator (pipeline.serving.loadgen.run_level) ever the bottleneck of a smoke load?

Target: run_level sustains ≥ 10× the request rate the tiny CPU server serves, measured
against a trivial local HTTP endpoint, at concurrency 1, 4 and 16.
Run: `.venv/bin/python bench/loadgen_capacity.py [--requests 400] [--vllm-requests 24]`
from the repository root (≈2 min on 2 cores; the vLLM part is skipped with a message when
`scripts/install-vllm --check` fails; `--quick`: 10 requests a level, no vLLM, to check the
script runs).

Endpoints, one at a time, each in its own process on 127.0.0.1:
    minimal   an asyncio stdlib server (below) that answers any POST with one fixed, prebuilt
              streamed completion (8 text chunks, a usage chunk, `data: [DONE]`), then closes
    fake      tests/fakes/openai_server.py (ThreadingHTTPServer, one thread per connection,
              builds and flushes every chunk)
    vllm      vLLM's CPU build serving the tiny Llama with the argv a vLLM manifest stores
              (max-num-seqs 4, as tests/smoke), max_tokens 8, ignore_eos
Every level gets a short warm-up first. requests/s = requests ÷ run_level's wall. CPU per
request is shown for this process (the load generator) and for the server process, so the
side that is saturated is visible: on 2 cores, a client and a server that each need ~1 core
per request stream are competing for the same two.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from _support import add_quick, exit_on_signals, loadavg, log, machine, process_cpu, quick_mode
from smoke_overhead import (
    SERVED_NAME,
    VLLM_ENV,
    fake_template,
    tiny_model,
    vllm_python,
    vllm_template,
)

from pipeline.serving.loadgen import Client, LoadLevel, run_level
from pipeline.serving.server import Server, free_port, render_argv, wait_ready

LEVELS = (1, 4, 16)
MAX_TOKENS = 8
PROMPTS = ["The capital of France is", "Write a haiku about GPUs."]
BODY: dict[str, Any] = {"model": SERVED_NAME, "max_tokens": MAX_TOKENS, "temperature": 0,
                        "ignore_eos": True, "stream_options": {"include_usage": True}}

MINIMAL_SERVER = r'''
import asyncio, json, sys
chunks = [{"id": "m", "object": "text_completion.chunk", "model": "m",
           "choices": [{"index": 0, "text": " tok", "finish_reason": None}]} for _ in range(8)]
chunks.append({"id": "m", "object": "text_completion.chunk", "choices": [],
               "usage": {"prompt_tokens": 6, "completion_tokens": 8, "total_tokens": 14}})
payload = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
payload += b"data: [DONE]\n\n"
ANSWER = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n"
          b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)

async def handle(reader, writer):
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        if length:
            await reader.readexactly(length)
        writer.write(ANSWER)
        await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()

async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", int(sys.argv[1]), backlog=512)
    print("minimal: serving", flush=True)
    async with server:
        await server.serve_forever()

asyncio.run(main())
'''


@contextmanager
def minimal_server() -> Iterator[tuple[Client, int]]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", MINIMAL_SERVER, str(port)],
                            stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("the minimal endpoint did not start") from None
                time.sleep(0.05)
        yield Client("127.0.0.1", port, timeout_s=30), proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def smoke_server(template: list[str], model_dir: Path, workdir: Path,
                 env: dict[str, str] | None, name: str) -> Iterator[tuple[Client, int]]:
    """A server started and awaited exactly as smoke() does (pipeline.serving.server), always
    stopped."""
    port = free_port()
    argv = render_argv(template, model_dir=model_dir, port=port)
    client = Client("127.0.0.1", port, timeout_s=120)
    with Server(argv, log_path=workdir / f"{name}.log", env=env) as server:
        ready = wait_ready(server, client, SERVED_NAME, timeout_s=600)
        log(f"{name}: ready after {ready:.1f} s")
        yield client, server.pid


def measure(client: Client, pid: int, name: str, requests: int, warmup: int
            ) -> list[dict[str, Any]]:
    rows = []
    for concurrency in LEVELS:
        run_level(client, BODY, PROMPTS, concurrency=concurrency, requests=warmup)
        cpu_client, cpu_server = time.process_time(), process_cpu(pid)
        level: LoadLevel = run_level(client, BODY, PROMPTS, concurrency=concurrency,
                                     requests=requests)
        cpu_client = time.process_time() - cpu_client
        cpu_server = process_cpu(pid) - cpu_server
        row = {"endpoint": name, "concurrency": concurrency, "requests": level.requests,
               "errors": level.errors, "wall_s": level.wall_s,
               "rps": level.requests / level.wall_s, "tokens": level.output_tokens,
               "client_cpu_ms_per_req": 1000 * cpu_client / level.requests,
               "server_cpu_ms_per_req": 1000 * cpu_server / level.requests,
               "ttft_p50_ms": 1000 * (level.ttft_p50_s or 0), "first_error": level.first_error}
        rows.append(row)
        log(json.dumps(row))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400, help="per level, trivial endpoints")
    parser.add_argument("--vllm-requests", type=int, default=24, help="per level, vLLM")
    add_quick(parser)
    args = parser.parse_args()
    quick = quick_mode(args.quick)
    warm = 2 if quick else 20
    if quick:
        args.requests = 10
    exit_on_signals()
    print(f"machine: {machine()}; load average before: {loadavg()}")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="loadgen-capacity-") as tmp:
        workdir = Path(tmp)
        model_dir = workdir / "fake-model"
        model_dir.mkdir()
        with minimal_server() as (client, pid):
            rows += measure(client, pid, "minimal", args.requests, warm)
        with smoke_server(fake_template(), model_dir, workdir, None, "fake") as (client, pid):
            rows += measure(client, pid, "fake", args.requests, warm)
        python = None if quick else vllm_python()  # quick: no vLLM start (~40 CPU-s)
        if python is not None:
            with smoke_server(vllm_template(python), tiny_model(), workdir, VLLM_ENV,
                              "vllm") as (client, pid):
                rows += measure(client, pid, "vllm", args.vllm_requests, 4)

    print("\n| endpoint | concurrency | requests | errors | req/s | client CPU ms/req "
          "| server CPU ms/req | TTFT p50 ms |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['endpoint']} | {row['concurrency']} | {row['requests']} | {row['errors']} "
              f"| {row['rps']:.1f} | {row['client_cpu_ms_per_req']:.2f} "
              f"| {row['server_cpu_ms_per_req']:.2f} | {row['ttft_p50_ms']:.1f} |")
    vllm = {r["concurrency"]: r["rps"] for r in rows if r["endpoint"] == "vllm"}
    if vllm:
        print("\n| concurrency | minimal ÷ vLLM | fake ÷ vLLM | target ≥ 10× |")
        print("|---|---|---|---|")
        for concurrency in LEVELS:
            ratios = [next(r["rps"] for r in rows if r["endpoint"] == name
                           and r["concurrency"] == concurrency) / vllm[concurrency]
                      for name in ("minimal", "fake")]
            print(f"| {concurrency} | {ratios[0]:.1f}× | {ratios[1]:.1f}× "
                  f"| {'met' if max(ratios) >= 10 else 'MISSED'} |")
    print(f"load average after: {loadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
