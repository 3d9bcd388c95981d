"""The weight bytes the TensorRT-LLM stand-ins move: safetensors files read and written with the
standard library (the format: an 8-byte little-endian header length, a JSON header of
`name: {dtype, shape, data_offsets}` plus an optional `__metadata__`, then the data), and the
stand-in engine file that carries them.

A real engine is about the size of its weights: TensorRT serializes the weights into the plan
unless the builder config sets STRIP_PLAN (tensorrt_llm/builder.py, stored version id
205252225, Builder.create_builder_config: `use_strip_plan` sets REFIT_INDIVIDUAL and
STRIP_PLAN), in which case the plan keeps each refittable weight's name and none of its bytes.
The stand-in engine file is one line naming it, one JSON line (rank, stripped, and per weight
its dtype, shape and size, in name order), then the weights' bytes in that order (none when
stripped). trtllm-refit (tensorrt_llm/commands/refit.py @548b5b73106a) matches the
checkpoint's weights to these names.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

MAGIC = b"stand-in engine for rank %d\n"


def read_safetensors(path: Path) -> dict[str, tuple[dict[str, Any], bytes]]:
    """name -> (its header entry, its bytes); {} for a file that is not safetensors (the
    older stand-in checkpoints held an empty header, a random file holds nothing readable)."""
    data = path.read_bytes()
    if len(data) < 8:
        return {}
    (size,) = struct.unpack("<Q", data[:8])
    try:
        header = json.loads(data[8:8 + size])
    except (ValueError, UnicodeDecodeError):
        return {}
    if not isinstance(header, dict):
        return {}
    body = data[8 + size:]
    found = {}
    for name, entry in header.items():
        if name == "__metadata__" or not isinstance(entry, dict):
            continue
        start, end = entry["data_offsets"]
        found[name] = (entry, body[start:end])
    return found


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int], bytes]]) -> None:
    """*tensors*: name -> (dtype, shape, bytes), written in name order."""
    header: dict[str, Any] = {}
    body = b""
    for name in sorted(tensors):
        dtype, shape, data = tensors[name]
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(body), len(body) + len(data)]}
        body += data
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the format aligns the data to 8 bytes
    path.write_bytes(struct.pack("<Q", len(text)) + text + body)


def write_engine(path: Path, rank: int, weights: dict[str, tuple[dict[str, Any], bytes]], *,
                 stripped: bool, profile: dict[str, Any]) -> None:
    """A rank engine holding *weights* (name -> (header entry, bytes)), or only their names
    when *stripped*. *profile* (the build's shape) makes engines of two shapes differ, as
    real plans do (their optimisation profiles and kernels), even with the same weights."""
    names = sorted(weights)
    header = {"rank": rank, "stripped": stripped, "profile": profile, "weights": {
        name: {"dtype": weights[name][0].get("dtype"), "shape": weights[name][0].get("shape"),
               "size": len(weights[name][1])} for name in names}}
    body = b"" if stripped else b"".join(weights[name][1] for name in names)
    path.write_bytes(MAGIC % rank + json.dumps(header).encode() + b"\n" + body)


def read_engine(path: Path) -> tuple[dict[str, Any], bytes]:
    """(header, weight bytes) of a stand-in rank engine; ValueError for anything else (a
    file TensorRT could not deserialize)."""
    data = path.read_bytes()
    first, _, rest = data.partition(b"\n")
    line, _, body = rest.partition(b"\n")
    if not first.startswith(b"stand-in engine for rank"):
        raise ValueError(f"{path} is not a serialized engine")
    try:
        header = json.loads(line)
    except ValueError:  # an engine of the older stand-in: no weights recorded
        return {"stripped": False, "weights": {}}, b""
    if not isinstance(header, dict):
        raise ValueError(f"{path} is not a serialized engine")  # noqa: TRY004 - as above
    return header, body
