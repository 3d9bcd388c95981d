"""The serve command for *this* node, from what a manifest records. Pure, no I/O.

A built engine or entry records the argv its smoke run started (`serve.argv`, with
`{model_dir}` and `{port}` left open, `serve.model_dir`: "self" for an engine, "input" for an
entry that serves its checkpoint, `inputs[0]`). That argv was written on the builder: its first
word is the builder's vLLM Python (or `trtllm-serve`) and it listens on 127.0.0.1. Pull
rewrites exactly those known parts, and nothing else:

    argv[0]                 the runtime executable found on this node (a Python that imports
                            vllm for `python -m vllm.entrypoints.cli.main serve …`, or for
                            `python -m vllm.entrypoints.openai.api_server …` as entries
                            recorded before vLLM 0.32; or `trtllm-serve`)
    --host VALUE            the host asked for (appended when the argv has none)
    {model_dir}, {port}     the pulled directory and the port asked for
    --tokenizer VALUE       (trtllm-serve of an engine) the tokenizer directory pull placed:
                            `<dir>/tokenizer`, which holds the source model's HF config.json
                            and tokenizer files; an engine published before engines carried
                            one recorded `--tokenizer {model_dir}` (its own config.json, which
                            trtllm-serve cannot load as a model config)

Rewriting at pull time, rather than recording `{host}`/`{python}` placeholders in new
manifests, keeps every entry already published servable as it is, and changes no key.

An imported artifact (`enginectl import`) records no serve argv; `template` writes the
runtime's plain command for it from its kind and labels (parallelism and shape), serving the
directory itself.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any, Final

from pipeline.stages.serve import VLLM_SERVE, vllm_form, vllm_model, vllm_start
from registry.errors import ManifestError
from registry.tokenizer import TOKENIZER_DIR

_PLACEHOLDER: Final = re.compile(r"\{model_dir\}|\{port\}")
RUNTIME_OF_KIND: Final = {"trtllm-engine": "trtllm", "trtllm-checkpoint": "trtllm-pytorch",
                          "vllm": "vllm"}


@dataclass(frozen=True)
class Template:
    """How to serve an artifact: the argv with placeholders, and where `{model_dir}` points
    ("self": the artifact's own files; "input": its checkpoint, `inputs[0]`)."""

    argv: tuple[str, ...]
    model_dir: str
    runtime: str  # vllm | trtllm | trtllm-pytorch
    recorded: bool  # False: written here for an imported artifact


def runtime_of(kind: str, labels: Mapping[str, Any]) -> str:
    runtime = labels.get("runtime") or RUNTIME_OF_KIND.get(kind)
    if runtime not in ("vllm", "trtllm", "trtllm-pytorch"):
        raise ManifestError(f"a {kind} artifact is not served by a runtime; pull takes "
                            "trtllm-engine, trtllm-checkpoint and vllm artifacts (fetch "
                            "takes the others)")
    return str(runtime)


def template(digest: str, kind: str, labels: Mapping[str, Any],
             serve: Mapping[str, Any] | None) -> Template:
    """The serve template of an artifact, recorded or (for an import) written here."""
    runtime = runtime_of(kind, labels)
    if serve and serve.get("argv"):
        argv = serve["argv"]
        if not isinstance(argv, list) or not all(isinstance(part, str) for part in argv):
            raise ManifestError(f"{digest}: serve.argv is not a list of strings")
        model_dir = serve.get("model_dir") or ("self" if kind == "trtllm-engine" else "input")
        if model_dir not in ("self", "input"):
            raise ManifestError(f"{digest}: serve.model_dir {model_dir!r} is not self or input")
        return Template(tuple(argv), str(model_dir), runtime, recorded=True)
    return Template(tuple(_plain_argv(runtime, labels)), "self", runtime, recorded=False)


def _plain_argv(runtime: str, labels: Mapping[str, Any]) -> list[str]:
    tp, pp = str(labels.get("tp") or 1), str(labels.get("pp") or 1)
    if runtime == "vllm":
        # no GPU named (a vLLM entry names none): the form every 0.32 distribution runs
        cpu = labels.get("gpu") in (None, "CPU")
        argv = [*vllm_start("python", "{model_dir}", cpu=cpu), "--served-model-name",
                str(labels.get("model") or "model"), "--host", "127.0.0.1", "--port", "{port}",
                "--tensor-parallel-size", tp, "--pipeline-parallel-size", pp]
        flags = {"max_seq_len": "--max-model-len", "max_batch_size": "--max-num-seqs"}
    else:
        backend = "tensorrt" if runtime == "trtllm" else "pytorch"
        argv = ["trtllm-serve", "{model_dir}", "--backend", backend]
        if runtime == "trtllm":
            argv += ["--tokenizer", "{model_dir}/" + TOKENIZER_DIR]
        argv += ["--host", "127.0.0.1", "--port", "{port}", "--tp_size", tp, "--pp_size", pp]
        flags = {"max_batch_size": "--max_batch_size", "max_seq_len": "--max_seq_len",
                 "max_num_tokens": "--max_num_tokens"}
    for label, flag in flags.items():
        if labels.get(label):
            argv += [flag, str(labels[label])]
    return argv


def node_argv(found: Template, *, executable: str, model_dir: str, host: str,
              port: int, tokenizer_dir: str | None = None) -> list[str]:
    """*found*'s argv for this node: *executable* first, listening on *host*:*port*, serving
    *model_dir* (and for an engine, with *tokenizer_dir* as its `--tokenizer`). A first word
    that is neither vLLM's module nor trtllm-serve is refused: it is not a command enginectl
    knows how to move to another machine."""
    values = {"{model_dir}": model_dir, "{port}": str(port)}
    # one pass: a directory named `x{port}` stays `x{port}` (-o is a path, not a template)
    argv = [_PLACEHOLDER.sub(lambda match: values[match.group(0)], part) for part in found.argv]
    if not argv:
        raise ManifestError("the recorded serve argv is empty")
    if found.runtime == "vllm":
        if vllm_form(argv) is None:
            raise ManifestError(f"serve argv {' '.join(found.argv[:4])!r} is not vLLM's "
                                f"`python {' '.join(VLLM_SERVE)}`; pull cannot move it")
    elif PurePath(argv[0]).name != "trtllm-serve":
        raise ManifestError(f"serve argv starts with {found.argv[0]!r}, not trtllm-serve; "
                            "pull cannot move it")
    argv[0] = executable
    if tokenizer_dir is not None and found.runtime == "trtllm":
        argv = _with_option(argv, "--tokenizer", tokenizer_dir)
    return _with_option(argv, "--host", host)


def _with_option(argv: list[str], flag: str, value: str) -> list[str]:
    """*argv* with *flag*'s value set to *value* (appended when *argv* has no *flag*)."""
    out, seen = [], False
    parts = iter(argv)
    for part in parts:
        if part == flag:
            next(parts, None)
            out += [flag, value]
            seen = True
        elif part.startswith(f"{flag}="):
            out.append(f"{flag}={value}")
            seen = True
        else:
            out.append(part)
    return out if seen else [*out, flag, value]


def served_name(argv: Sequence[str], runtime: str, model_dir: str) -> str:
    """The model id the server answers to: vLLM's `--served-model-name` (else the model it
    serves); for trtllm-serve the model directory's name (it has no option to name it)."""
    if runtime == "vllm":
        if "--served-model-name" in argv[:-1]:
            return argv[list(argv).index("--served-model-name") + 1]
        return vllm_model(argv) or model_dir
    return PurePath(model_dir).name
