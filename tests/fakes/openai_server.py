"""A stand-in OpenAI server for the smoke harness's own tests (stdlib only).

    python openai_server.py MODEL_DIR --host H --port P [--served-model-name NAME]
                            [--max-model-len N]        (other flags are accepted and ignored)
    python openai_server.py --model MODEL_DIR ...      (vLLM's spelling)

It serves the routes vLLM and trtllm-serve expose — GET /health, GET /v1/models, POST
/v1/completions (with `stream: true` as server-sent events ending in `data: [DONE]`, and
`stream_options.include_usage`), POST /v1/chat/completions, POST /tokenize — and "generates"
deterministic words: the same prompt always gives the same text, one word per token, never an
end of sequence. Prompt tokens are whitespace-separated words (plus one for BOS).

Knobs (environment):
    FAKE_OPENAI_FAIL_GENERATION=1   /health is 200, every generation answers 500
    FAKE_OPENAI_TRUNCATE=N          prompts are silently cut to N tokens (usage says N)
    FAKE_OPENAI_NO_TOKENIZE=1       no /tokenize route (404), as trtllm-serve
    FAKE_OPENAI_STRICT=1            fields beyond the OpenAI API (ignore_eos, stream_options)
                                    are refused with 400, and streams carry no usage
    FAKE_OPENAI_TOKEN_DELAY_S=S     answer slower: each generated token takes S seconds more
                                    (a slower build of the same model), before the answer
    FAKE_OPENAI_DELAYS=JSON         per artifact: {"dotted.path=value": S, ...} sets S for a
                                    served directory whose config.json has that value at that
                                    path (value as JSON: `build_config.plugin_config.
                                    use_fused_mlp=false`); the first match wins, else
                                    FAKE_OPENAI_TOKEN_DELAY_S
    FAKE_OPENAI_SLOW_FRACTION=F     a noisy neighbour: each generation is, with probability F,
    FAKE_OPENAI_SLOW_FACTOR=K       K times slower (default 4) than the delay above, drawn
    FAKE_OPENAI_SEED=N              from a random.Random(N) (default 0) once per generation
    FAKE_OPENAI_BUSY_ONCE=D         a node busy at the moment each model directory is first
                                    served (D holds a file per directory served): that start's
                                    every generation is FAKE_OPENAI_SLOW_FACTOR times slower
    FAKE_OPENAI_MAX_RUNNING=N       at most N generations at once, the rest wait their turn
                                    (a server's batch slots: trtllm-serve's --max_batch_size,
                                    vLLM's --max-num-seqs), so that open-loop traffic past
                                    N ÷ (delay × tokens) requests/s queues and TTFT grows
    FAKE_OPENAI_PORT_TAKEN_ONCE=F   the first start (no file F yet: it makes F) finds its port
                                    taken by another process, and dies as a server does:
                                    OSError: [Errno 98] Address already in use
A MODEL_DIR that is not a directory makes it exit 1 at start, as a real server would.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import threading
import time
import zlib
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
         "juliet", "kilo", "lima", "mike", "november", "oscar", "papa")


class Fake:
    """What the server says and refuses. `style` picks whose answers it gives: "vllm" (the
    default), or trtllm-serve's under its "tensorrt" or "pytorch" backend (see
    tests/fakes/bin/trtllm-serve for the sources): TRT-LLM's error body, no check of the
    request's model field, and its context-length rules."""

    def __init__(self, name: str, max_model_len: int, *, style: str = "vllm",
                 max_num_tokens: int | None = None,
                 chat: Callable[[dict[str, Any]], str] | None = None) -> None:
        self.name = name
        # a chat request's prompt: the fake's template, or (trtllm-serve) the tokenizer's,
        # which raises ValueError (answered 400) when there is none
        self.chat = chat or (lambda body: chat_prompt(body.get("messages") or []))
        self.max_model_len = max_model_len
        self.style = style
        self.max_num_tokens = max_num_tokens
        self.fail = os.environ.get("FAKE_OPENAI_FAIL_GENERATION") == "1"
        truncate = os.environ.get("FAKE_OPENAI_TRUNCATE")
        self.truncate = int(truncate) if truncate else None
        self.tokenize = os.environ.get("FAKE_OPENAI_NO_TOKENIZE") != "1"
        self.strict = os.environ.get("FAKE_OPENAI_STRICT") == "1"
        self.token_delay_s = float(os.environ.get("FAKE_OPENAI_TOKEN_DELAY_S") or 0)
        self.slow_fraction = float(os.environ.get("FAKE_OPENAI_SLOW_FRACTION") or 0)
        self.slow_factor = float(os.environ.get("FAKE_OPENAI_SLOW_FACTOR") or 4)
        self._random = random.Random(int(os.environ.get("FAKE_OPENAI_SEED") or 0))
        self._random_lock = threading.Lock()
        running = int(os.environ.get("FAKE_OPENAI_MAX_RUNNING") or 0)
        self.slots = threading.BoundedSemaphore(running) if running > 0 else None

    def delay_for(self, model_dir: Path) -> None:
        """Take the per-token delay FAKE_OPENAI_DELAYS names for *model_dir*'s config.json,
        times FAKE_OPENAI_SLOW_FACTOR when FAKE_OPENAI_BUSY_ONCE finds it first served."""
        self._delay_from_table(model_dir)
        busy = os.environ.get("FAKE_OPENAI_BUSY_ONCE")
        if busy:
            seen = Path(busy) / zlib.crc32(str(model_dir.resolve()).encode()).to_bytes(4).hex()
            seen.parent.mkdir(parents=True, exist_ok=True)
            if not seen.exists():
                seen.touch()
                self.token_delay_s *= self.slow_factor

    def _delay_from_table(self, model_dir: Path) -> None:
        table = json.loads(os.environ.get("FAKE_OPENAI_DELAYS") or "{}")
        try:
            config = json.loads((model_dir / "config.json").read_text())
        except (OSError, ValueError):
            return
        for selector, seconds in table.items():
            path, _, wanted = selector.partition("=")
            value: Any = config
            for part in path.split("."):
                value = value.get(part) if isinstance(value, dict) else None
            if value == json.loads(wanted):
                self.token_delay_s = float(seconds)
                return

    def generation_delay(self, tokens: int) -> float:
        """How long a generation of *tokens* takes here (the noise drawn once per call)."""
        with self._random_lock:
            slow = self._random.random() < self.slow_fraction
        return self.token_delay_s * tokens * (self.slow_factor if slow else 1)

    @staticmethod
    def tokens(text: str) -> list[int]:
        """BOS then one id per word."""
        return [1, *(zlib.crc32(word.encode()) % 30000 + 10 for word in text.split())]

    def prompt_tokens(self, text: str) -> int:
        count = len(self.tokens(text))
        return count if self.truncate is None else min(count, self.truncate)

    def limit(self, prompt_tokens: int, max_tokens: int) -> tuple[str | None, int]:
        """Why a request is refused (None if not), and how many tokens it gets."""
        if self.style == "tensorrt":
            return self._limit_tensorrt(prompt_tokens, max_tokens), max_tokens
        if self.style == "pytorch":
            return self._limit_pytorch(prompt_tokens, max_tokens)
        if prompt_tokens + max_tokens > self.max_model_len:
            return (f"This model's maximum context length is {self.max_model_len} tokens. "
                    f"However, you requested {prompt_tokens + max_tokens} tokens."), max_tokens
        return None, max_tokens

    def _limit_tensorrt(self, prompt_tokens: int, max_tokens: int) -> str | None:
        """tensorrt_llm/llmapi/llm.py BaseLLM._check_arguments, the TensorRT-engine branch."""
        if prompt_tokens + max_tokens <= self.max_model_len:
            return None
        return (f"The sum of prompt length ({float(prompt_tokens)}) and query length (0) "
                f"max_tokens ({max_tokens}) should not exceed max_seq_len "
                f"({self.max_model_len})")

    def _limit_pytorch(self, prompt_tokens: int, max_tokens: int) -> tuple[str | None, int]:
        """llm.py _check_arguments (the pytorch branch), then executor/base_worker.py
        _deduce_max_tokens, which lowers max_tokens to what max_seq_len leaves."""
        if self.max_num_tokens and prompt_tokens > self.max_num_tokens:
            return (f"The sum of prompt length ({float(prompt_tokens)}), query length (0) "
                    f"should not exceed max_num_tokens ({self.max_num_tokens})"), max_tokens
        left = self.max_model_len - prompt_tokens
        if left <= 0:
            return (f"`default_max_tokens` ({left}) should be greater than 0, "
                    f"`default_max_tokens` ({left}) = max_seq_len ({self.max_model_len}) - "
                    f"`splited_prompt_len` ({prompt_tokens}) - `query_token_len` (0)"), 0
        return None, min(max_tokens, left)

    @staticmethod
    def generate(text: str, count: int) -> list[str]:
        start = zlib.crc32(text.encode())
        return [" " + WORDS[(start + i) % len(WORDS)] for i in range(count)]


def chat_prompt(messages: list[dict[str, Any]]) -> str:
    """The fake's chat template."""
    turns = [f"<{m.get('role')}> {m.get('content')}" for m in messages]
    return " ".join([*turns, "<assistant>"])


class Handler(BaseHTTPRequestHandler):
    server: FakeHTTPServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        print(f"fake-openai: {format % args}", flush=True)

    def _json(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str) -> None:
        if self.server.fake.style != "vllm":  # tensorrt_llm/serve/openai_protocol.py ErrorResponse
            self._json(status, {"object": "error", "message": message,
                                "type": "BadRequestError" if status == 400 else "InternalError",
                                "param": None, "code": status})
            return
        self._json(status, {"error": {"message": message, "code": status}})

    def do_GET(self) -> None:
        fake = self.server.fake
        if self.path == "/health":
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path == "/v1/models":
            card: dict[str, Any] = {"id": fake.name, "object": "model"}
            card |= ({"max_model_len": fake.max_model_len} if fake.style == "vllm"
                     else {"created": int(time.time()), "owned_by": "tensorrt_llm"})
            self._json(200, {"object": "list", "data": [card]})
        else:
            self._error(404, f"no route {self.path}")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except json.JSONDecodeError as exc:
            self._error(400, f"bad JSON: {exc}")
            return
        fake = self.server.fake
        if self.path == "/tokenize" and fake.tokenize:
            text = body.get("prompt") or chat_prompt(body.get("messages") or [])
            tokens = fake.tokens(text)
            if body.get("add_special_tokens") is False:
                tokens = tokens[1:]
            self._json(200, {"count": len(tokens), "tokens": tokens,
                             "max_model_len": fake.max_model_len})
        elif self.path in ("/v1/completions", "/v1/chat/completions"):
            self._generate(body, chat=self.path.endswith("chat/completions"))
        else:
            self._error(404, f"no route {self.path}")

    def _generate(self, body: dict[str, Any], *, chat: bool) -> None:
        fake = self.server.fake
        if fake.style == "vllm" and body.get("model") != fake.name:  # trtllm-serve never checks
            self._error(404, f"The model `{body.get('model')}` does not exist.")
            return
        extra = [name for name in ("ignore_eos", "stream_options") if name in body]
        if fake.strict and extra:
            self._error(400, f"extra fields not permitted: {', '.join(extra)}")
            return
        if fake.fail:
            self._error(500, "EngineCore encountered an issue (FAKE_OPENAI_FAIL_GENERATION)")
            return
        if chat:
            try:
                prompt = fake.chat(body)
            except ValueError as exc:  # trtllm-serve: openai_chat's create_error_response
                self._error(400, str(exc))
                return
        else:
            prompt = str(body.get("prompt"))
        max_tokens = int(body.get("max_tokens") or 16)
        prompt_tokens = fake.prompt_tokens(prompt)
        refused, max_tokens = fake.limit(prompt_tokens, max_tokens)
        if refused is not None:
            self._error(400, refused)
            return
        words = fake.generate(prompt, max_tokens)
        if fake.slots is not None:
            with fake.slots:  # waits in the queue for a batch slot, then generates
                time.sleep(fake.generation_delay(len(words)))
        elif (delay := fake.generation_delay(len(words))) > 0:  # the knobs: slower, noisy
            time.sleep(delay)
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": len(words),
                 "total_tokens": prompt_tokens + len(words)}
        kind = "chat.completion" if chat else "text_completion"
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            self._stream(words, kind, chat=chat, usage=usage if include_usage else None)
            return
        text = "".join(words).strip() if chat else "".join(words)
        choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        self._json(200, {"id": "fake-1", "object": kind, "created": int(time.time()),
                         "model": fake.name, "choices": [choice], "usage": usage})

    def _stream(self, words: list[str], kind: str, *, chat: bool,
                usage: dict[str, int] | None) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def event(payload: Any) -> None:
            data = f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"
            raw = data.encode()
            self.wfile.write(f"{len(raw):x}\r\n".encode() + raw + b"\r\n")
            self.wfile.flush()

        for i, word in enumerate(words):
            last = i == len(words) - 1
            choice: dict[str, Any] = {"index": 0, "finish_reason": "length" if last else None}
            if chat:
                choice["delta"] = {"content": word}
            else:
                choice["text"] = word
            event({"id": "fake-1", "object": f"{kind}.chunk", "model": self.server.fake.name,
                   "choices": [choice]})
        if usage is not None:
            event({"id": "fake-1", "object": f"{kind}.chunk", "choices": [], "usage": usage})
        event("[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


class FakeHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # socketserver's default backlog of 5 resets a burst of clients

    def __init__(self, address: tuple[str, int], fake: Fake) -> None:
        super().__init__(address, Handler)
        self.fake = fake


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="openai_server.py")
    parser.add_argument("model_dir", nargs="?")
    parser.add_argument("--model")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name")
    parser.add_argument("--max-model-len", type=int, default=2048)
    args, ignored = parser.parse_known_args(argv)
    model_dir = args.model or args.model_dir
    if model_dir is None or not Path(model_dir).is_dir():
        print(f"fake-openai: error: model directory {model_dir!r} does not exist", flush=True)
        return 1
    fake = Fake(args.served_model_name or model_dir, args.max_model_len)
    fake.delay_for(Path(model_dir))
    return run(fake, args.host, args.port, note=f"ignored: {' '.join(ignored) or 'nothing'}")


def run(fake: Fake, host: str, port: int, *, note: str = "") -> int:
    """Serve *fake* on host:port until killed."""
    flag = os.environ.get("FAKE_OPENAI_PORT_TAKEN_ONCE")
    if flag and not Path(flag).exists():  # another process binds the port first (it lives
        Path(flag).touch()  # as long as this one): the real bind below fails with EADDRINUSE
        import socket

        taken = socket.create_server((host, port))  # noqa: F841 - held until exit
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _die_of_it)
    with FakeHTTPServer((host, port), fake) as httpd:
        print(f"fake-openai: serving {fake.name!r} on {host}:{port} ({fake.style}; {note})",
              flush=True)
        httpd.serve_forever()
    return 0


def _die_of_it(signum: int, _frame: object) -> None:
    """SIGINT or SIGTERM: die of it, as the real servers do. Their HTTP server, uvicorn,
    catches both, shuts down, restores the handlers and raises the signal again
    (uvicorn/server.py Server.capture_signals), so the process ends by that signal; this
    stand-in has nothing to shut down. Left to Python's KeyboardInterrupt, a Ctrl-C landing
    while socketserver starts a request's thread surfaced as "RuntimeError: release unlocked
    lock", which socketserver's handle_error swallowed, and the stand-in served on (a CI
    rehearsal of `enginectl serve` hung on it)."""
    signal.signal(signum, signal.SIG_DFL)
    signal.raise_signal(signum)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
