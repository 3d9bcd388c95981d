"""Smoke serving through the trtllm-serve stand-in, which answers as TensorRT-LLM 1.2 does,
and the stand-in's memo of transformers loads (tests/fakes/transformers_memo.py): a start on
files that loaded before answers as that load did, chat included, and a file that changed is
loaded again, through transformers, and fails as transformers fails.

The engines are made by the convert and trtllm-build stand-ins from the argv enginectl emits,
and served with the argv enginectl emits (pipeline.stages.serve.trtllm_serve_argv) through
pipeline.serving.verdict.run_smoke, as the build and `enginectl smoke` run it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.recipe.matrix import Shape
from pipeline.recipe.schema import BuildSettings, SmokeSettings, TrtllmServe
from pipeline.serving.smoke import SmokeReport, SmokeServer, smoke
from pipeline.serving.verdict import SmokeJob, run_smoke
from pipeline.stages.build import build_argv, build_flags
from pipeline.stages.convert import convert_argv
from pipeline.stages.serve import trtllm_serve_argv
from tests.helpers import ROOT
from tests.tokenizer_files import write_tokenizer

FAKES = ROOT / "tests" / "fakes"
TRTLLM_SERVE = str(FAKES / "bin" / "trtllm-serve")
SHAPE = Shape(max_batch_size=4, max_input_len=120, max_seq_len=256)
SETTINGS = SmokeSettings(prompts=["The capital of France is"], max_tokens=4, concurrency=[1],
                         requests=2, ready_timeout_s=60, request_timeout_s=30)
HF_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
             "num_hidden_layers": 2, "hidden_size": 128, "intermediate_size": 256,
             "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 1000,
             "max_position_embeddings": 4096, "rope_theta": 10000.0}


def hf_checkpoint(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(HF_CONFIG))
    (path / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    return write_tokenizer(path)


def make_engine(root: Path, *, tp: int = 1, shape: Shape = SHAPE) -> Path:
    """An engine directory as the build stage makes one: convert, then trtllm-build."""
    hf = hf_checkpoint(root / "hf")
    checkpoint, engine = root / "checkpoint", root / "engine-0123abcd"
    convert = convert_argv(sys.executable, FAKES / "examples", family="llama", model_dir=hf,
                           output_dir=checkpoint, dtype="bfloat16", tp=tp, pp=1, workers=1)
    flags = build_flags(BuildSettings(), shape, "bf16", "auto", tp=tp, family="llama")
    build = build_argv(checkpoint_dir=checkpoint, output_dir=engine, flags=flags, workers=1)
    build[0] = str(FAKES / "bin" / "trtllm-build")
    for argv in (convert, [sys.executable, *build]):  # in *root*: trtllm-build writes its
        # timing cache to ./model.cache when no --output_timing_cache is given
        subprocess.run(argv, check=True, capture_output=True, timeout=60, cwd=root)
    # the build stage's tokenizer/ (pipeline.executors.work): the HF config and tokenizer files
    shutil.copytree(hf, engine / "tokenizer", ignore=shutil.ignore_patterns("*.safetensors"))
    return engine


def serve_argv(model_dir: Path, *, backend: str, tp: int = 1, shape: Shape = SHAPE) -> list[str]:
    argv = trtllm_serve_argv(model_dir=model_dir,
                             tokenizer_dir=model_dir / "tokenizer" if backend == "tensorrt"
                             else None,
                             backend=backend, tp=tp, pp=1, shape=shape, settings=TrtllmServe())
    return [TRTLLM_SERVE, *argv[1:]]


def smoke_it(argv: list[str], model_dir: Path, tmp_path: Path) -> SmokeReport:
    return run_smoke(SmokeJob(
        digest="", argv=argv, model_dir=model_dir, served_name="toy", smoke=SETTINGS, quant=None,
        max_input_len=SHAPE.max_input_len, price_per_hour=None, log_path=tmp_path / "smoke.log",
        cpu=False, serving_dir=tmp_path / "serve"))


def test_an_engine_is_smoked_under_the_id_trtllm_serve_gives_it(tmp_path: Path) -> None:
    """trtllm-serve lists a local directory under its name, not the path it was given."""
    engine = make_engine(tmp_path)
    argv = serve_argv(engine, backend="tensorrt")

    report = smoke_it(argv, engine, tmp_path)

    assert report.passed, report.failure
    models = report.check("models")
    assert models is not None
    assert models.evidence["ids"] == ["engine-0123abcd"]
    # What run_smoke used to expect, the path as given, is not what the server lists.
    by_path = smoke(SmokeServer(argv, engine, str(engine), tmp_path / "by-path.log"),
                    settings=SETTINGS, max_input_len=SHAPE.max_input_len, price_per_hour=None)
    assert by_path.failure is not None
    assert by_path.failure.startswith(f"models: {str(engine)!r} not among ['engine-0123abcd']")


def test_an_engine_does_not_load_under_the_default_pytorch_backend(tmp_path: Path) -> None:
    engine = make_engine(tmp_path)
    argv = serve_argv(engine, backend="tensorrt")
    at = argv.index("--backend")
    del argv[at:at + 2]

    report = smoke_it(argv, engine, tmp_path)

    assert report.failure is not None
    assert report.failure.startswith("ready: the server exited with code 1")
    ready = report.check("ready")
    assert ready is not None
    assert "Unrecognized model" in ready.evidence["log_tail"]


def test_an_engine_missing_a_rank_is_not_served(tmp_path: Path) -> None:
    engine = make_engine(tmp_path, tp=2)
    (engine / "rank1.engine").unlink()

    report = smoke_it(serve_argv(engine, backend="tensorrt", tp=2), engine, tmp_path)

    ready = report.check("ready")
    assert ready is not None
    assert not ready.passed
    assert "rank1.engine" in ready.evidence["log_tail"]


def test_the_context_limit_is_the_one_in_the_engines_config(tmp_path: Path) -> None:
    """Served with --max_seq_len 4096, an engine built for 64 still refuses what exceeds 64,
    with TRT-LLM's HTTP 400 and message."""
    engine = make_engine(tmp_path, shape=Shape(max_batch_size=4, max_input_len=60,
                                               max_seq_len=64))
    argv = serve_argv(engine, backend="tensorrt",
                      shape=Shape(max_batch_size=4, max_input_len=4000, max_seq_len=4096))

    report = smoke_it(argv, engine, tmp_path)

    assert report.failure is not None
    assert report.failure.startswith("long_prompt: a 112-token prompt was refused: HTTP 400")
    assert "should not exceed max_seq_len (64)" in report.failure
    assert '"type": "BadRequestError"' in report.failure


def test_a_pytorch_backend_entry_serves_the_checkpoint(tmp_path: Path) -> None:
    checkpoint = hf_checkpoint(tmp_path / "hf-0123abcd")

    report = smoke_it(serve_argv(checkpoint, backend="pytorch"), checkpoint, tmp_path)

    assert report.passed, report.failure
    models = report.check("models")
    assert models is not None
    assert models.evidence["ids"] == ["hf-0123abcd"]


def run_logged(argv: list[str], engine: Path, where: Path) -> tuple[SmokeReport, str]:
    """A smoke of *argv*, and the server's log."""
    where.mkdir()
    return smoke_it(argv, engine, where), (where / "smoke.log").read_text()


def remembered(memo: Path) -> tuple[list[Path], list[Path]]:
    """The memo's entries: loads (a model_type) and chat renderings (a text)."""
    entries = sorted(memo.glob("*.json"))
    loads = [p for p in entries if "model_type" in json.loads(p.read_text())]
    return loads, [p for p in entries if p not in loads]


def chat_content(report: SmokeReport) -> str:
    chat = report.check("chat")
    assert chat is not None
    assert chat.passed
    return str(chat.evidence["content"])


def test_a_load_that_succeeded_answers_from_the_memo_and_a_changed_file_loads_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    memo = tmp_path / "memo"
    monkeypatch.setenv("FAKE_TRTLLM_MEMO", str(memo))
    engine = make_engine(tmp_path / "build")
    argv = serve_argv(engine, backend="tensorrt")

    first, log = run_logged(argv, engine, tmp_path / "first")
    assert first.passed, first.failure
    assert f"tokenizer {engine / 'tokenizer'}, model_type llama" in log
    loads, renderings = remembered(memo)
    assert len(loads) == 1
    assert len(renderings) == 1  # the chat check's one request

    # the next start answers from the memo: the model_type it prints, and the chat prompt the
    # fake generates from, are the memo's
    loads[0].write_text(json.dumps({"model_type": "from-the-memo"}))
    renderings[0].write_text(json.dumps({"text": "a prompt from the memo"}))
    again, log = run_logged(argv, engine, tmp_path / "again")
    assert again.passed, again.failure
    assert "model_type from-the-memo" in log
    assert chat_content(again) != chat_content(first)

    # without the rendering, the chat request loads the tokenizer when it comes, renders as
    # the first start did, and is remembered again
    renderings[0].unlink()
    fresh, log = run_logged(argv, engine, tmp_path / "fresh")
    assert fresh.passed, fresh.failure
    assert "model_type from-the-memo" in log
    assert chat_content(fresh) == chat_content(first)
    assert len(remembered(memo)[1]) == 1

    # a tokenizer file that changed is a new key: loaded, through transformers, and refused
    (engine / "tokenizer" / "tokenizer_config.json").write_text("{not json")
    broken, log = run_logged(argv, engine, tmp_path / "broken")
    assert broken.failure is not None
    assert broken.failure.startswith("ready: the server exited with code 1")
    assert "JSONDecodeError" in log
    assert "from-the-memo" not in log
    assert [len(kept) for kept in remembered(memo)] == [1, 1]  # a failed load is not kept


def test_a_chat_request_that_fails_to_render_is_never_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tokenizer without a chat template refuses the chat check on every start, as
    TRT-LLM's server does, memo or not."""
    memo = tmp_path / "memo"
    monkeypatch.setenv("FAKE_TRTLLM_MEMO", str(memo))
    engine = make_engine(tmp_path / "build")
    config_path = engine / "tokenizer" / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.pop("chat_template", None)
    config_path.write_text(json.dumps(config))
    argv = serve_argv(engine, backend="tensorrt")
    for attempt in ("first", "again"):
        report, _ = run_logged(argv, engine, tmp_path / attempt)
        chat = report.check("chat")
        assert chat is not None
        assert not chat.passed
        assert "No chat template found" in chat.message
        assert [len(kept) for kept in remembered(memo)] == [1, 0]


def test_a_load_that_only_a_path_names_is_not_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A config.json with no model_type loads only where a model name is in its path
    (AutoConfig's fallback): such a load is never kept, so the same files elsewhere fail."""
    memo = tmp_path / "memo"
    monkeypatch.setenv("FAKE_TRTLLM_MEMO", str(memo))
    engine = make_engine(tmp_path / "build")
    untyped = {k: v for k, v in HF_CONFIG.items() if k != "model_type"}
    named, plain = tmp_path / "llama-tokenizer", tmp_path / "plain-tokenizer"
    for where in (named, plain):
        shutil.copytree(engine / "tokenizer", where)
        (where / "config.json").write_text(json.dumps(untyped))
    argv = serve_argv(engine, backend="tensorrt")
    at = argv.index("--tokenizer") + 1

    found, log = run_logged([*argv[:at], str(named), *argv[at + 1:]], engine,
                            tmp_path / "named")
    assert found.passed, found.failure
    assert "model_type llama" in log
    assert not memo.exists() or not list(memo.glob("*.json"))

    lost, log = run_logged([*argv[:at], str(plain), *argv[at + 1:]], engine, tmp_path / "plain")
    assert lost.failure is not None
    assert lost.failure.startswith("ready: the server exited with code 1")
    assert "no attribute 'model_type'" in log
