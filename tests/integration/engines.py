"""A toy TensorRT-LLM engine directory and what a test needs to import it, publish it, or
damage it in the store behind the store's back."""

from __future__ import annotations

import json
import os
from pathlib import Path

from registry.context import Context
from registry.ops.adopt import ImportSpec


def make_engine(root: Path, *, tp: int = 2, seed: int = 0, seq: int = 4096) -> Path:
    root.mkdir(parents=True)
    config = {
        "version": "1.2.1",
        "pretrained_config": {"mapping": {"tp_size": tp, "pp_size": 1}},
        "build_config": {"max_batch_size": 64, "max_input_len": 2048, "max_seq_len": seq},
    }
    (root / "config.json").write_text(json.dumps(config))
    for rank in range(tp):
        (root / f"rank{rank}.engine").write_bytes(os.urandom(50_000) + bytes([seed]))
    (root / "tokenizer").mkdir()
    (root / "tokenizer" / "tokenizer.json").write_text('{"model": "shared"}')
    return root


def engine_spec(**overrides: object) -> ImportSpec:
    fields: dict[str, object] = {"kind": "trtllm-engine", "model": "m", "gpu": "h100",
                                 "quant": "fp8", "status": "ready"}
    return ImportSpec(**(fields | overrides))  # type: ignore[arg-type]


def overwrite(ctx: Context, key: str, data: bytes) -> None:
    """Change a stored object behind the store's back, as a careless hand would."""
    if ctx.store.url.startswith("file://"):
        path = Path(ctx.store.url.removeprefix("file://")) / key
        path.chmod(0o644)
        path.write_bytes(data)
        return
    import boto3

    bucket, _, prefix = ctx.store.url.removeprefix("s3://").partition("/")
    client = boto3.client("s3", endpoint_url=ctx.config.s3_endpoint_url)
    client.put_object(Bucket=bucket, Key=f"{prefix}/{key}", Body=data)
