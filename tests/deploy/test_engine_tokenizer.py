"""An engine published before engines carried their tokenizer directory (its recorded argv
names the engine dir as --tokenizer, which trtllm-serve 1.2 cannot load a model config from)
keeps serving chat: pull follows its provenance to the hf-checkpoint it was built from and
places that checkpoint's config.json and tokenizer files in `tokenizer/` beside it.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import time
from pathlib import Path

from pipeline.deploy.pull import pull
from pipeline.serving.server import free_port
from registry.context import Context
from registry.ops.marker import SERVE_FILE
from tests.deploy import artifacts
from tests.helpers import FAKES

TRTLLM_SERVE = str(FAKES / "bin" / "trtllm-serve")


def answers_chat(argv: list[str], port: int, cwd: Path) -> str:
    """Start *argv* (serve.json's) from *cwd*, ask one chat question, stop it."""
    with (cwd / "server.log").open("wb") as log:
        process = subprocess.Popen(argv, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and process.poll() is None:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            try:
                connection.request("POST", "/v1/chat/completions", body=json.dumps(
                    {"model": "m", "messages": [{"role": "user", "content": "hello"}],
                     "max_tokens": 3}), headers={"Content-Type": "application/json"})
                answer = connection.getresponse()
                body = json.loads(answer.read())
            except OSError:
                time.sleep(0.2)
                continue
            finally:
                connection.close()
            assert answer.status == 200, body
            content: str = body["choices"][0]["message"]["content"]
            return content
        raise AssertionError((cwd / "server.log").read_text())
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def test_an_old_engine_gets_its_source_checkpoints_tokenizer_through_provenance(
    ctx: Context, tmp_path: Path
) -> None:
    source = artifacts.checkpoint(ctx, tmp_path / "hf", loadable=True)
    converted = artifacts.converted(ctx, tmp_path / "converted", source)
    old = artifacts.engine(ctx, tmp_path / "engine", tokenizer=False, inputs=(converted,))
    dest = tmp_path / "node"
    port = free_port()

    pulled = pull(ctx, old, dest, executable=TRTLLM_SERVE, host="127.0.0.1", port=port)

    assert pulled.sources == (old, source)  # the checkpoint's files, not the converted one's
    placed = {p.relative_to(dest).as_posix() for p in (dest / "tokenizer").rglob("*")}
    assert placed == {"tokenizer/config.json", "tokenizer/tokenizer.json",
                      "tokenizer/tokenizer_config.json"}  # never its weights
    assert (dest / "tokenizer" / "config.json").read_bytes() == \
        (tmp_path / "hf" / "config.json").read_bytes()
    assert pulled.argv[pulled.argv.index("--tokenizer") + 1] == str(dest / "tokenizer")
    assert json.loads((dest / SERVE_FILE).read_text())["tokenizer_dir"] == str(dest / "tokenizer")
    assert not pulled.notes
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert answers_chat(pulled.argv, port, elsewhere)


def test_an_old_engine_without_provenance_is_pulled_with_a_note_that_it_cannot_chat(
    ctx: Context, tmp_path: Path
) -> None:
    old = artifacts.engine(ctx, tmp_path / "engine", tokenizer=False)
    dest = tmp_path / "node"

    pulled = pull(ctx, old, dest, executable=TRTLLM_SERVE, host="127.0.0.1", port=free_port())

    (said,) = pulled.notes
    assert "serves completions but not chat" in said
    assert "--tokenizer-from" in said
    assert pulled.tokenizer_dir is None
    assert pulled.argv[pulled.argv.index("--tokenizer") + 1] == str(dest)  # as recorded
    assert not (dest / "tokenizer").exists()
