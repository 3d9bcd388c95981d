"""The recipe's vocabulary: the literal types, the size limits, and the strict base model and
field helpers every section of the schema shares.

Limits: a recipe is a few KB. What `plan` does with one is bounded, so that it answers in well
under a second for anything accepted (bench/README.md, `plan_speed.py`): the file is at most
MAX_RECIPE_BYTES (PyYAML reads ~2 MB/s of dense YAML), every list has a cap (MAX_AXIS values
per matrix axis, MAX_SHAPES shapes, MAX_FILTERS exclude or include entries, MAX_SMOKE_ITEMS
prompts, references and prices, MAX_LEVELS concurrency levels or capacity rates,
MAX_CAPACITY_ROUNDS rounds of a capacity curve), and the matrix makes at most
MAX_TARGETS targets.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from registry.gpus import UnknownGpuError, lookup_gpu

Quant = Literal["bf16", "fp16", "fp8", "int4_awq", "int8_sq", "w4a8_awq", "nvfp4"]
KvCacheDtype = Literal["auto", "fp8", "int8"]
Runtime = Literal["trtllm", "trtllm-pytorch", "vllm"]
ModelDtype = Literal["bfloat16", "float16"]

QUANTS: tuple[Quant, ...] = ("bf16", "fp16", "fp8", "int4_awq", "int8_sq", "w4a8_awq", "nvfp4")
RUNTIMES: tuple[Runtime, ...] = ("trtllm", "trtllm-pytorch", "vllm")
COMMIT = re.compile(r"^[0-9a-f]{40}$")
NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
# Model sizes and shapes are int32 in TensorRT-LLM; the bound also keeps the memory math finite.
_INT32_MAX = 2**31 - 1
GOT_MAX = 80  # characters of a bad value quoted in a message

MAX_RECIPE_BYTES = 256 * 1024
MAX_AXIS = 16  # values of a matrix axis (the GPU catalog has fewer SKUs)
MAX_SHAPES = 64
MAX_FILTERS = 64  # exclude or include entries
MAX_SMOKE_ITEMS = 64  # prompts, reference outputs, GPU prices
MAX_LEVELS = 16  # smoke concurrency levels: each is a load run
MAX_CAPACITY_ROUNDS = 10  # rounds of a capacity curve: each goes up every rate again
MAX_TARGETS = 512  # before exclude, includes added: plan keys ~2000 targets a second


def as_list(value: Any) -> Any:
    """Matrix axes accept a scalar as a one-element list: `tp: 8` means `tp: [8]`."""
    return value if isinstance(value, list) else [value]


def unique(values: list[Any]) -> list[Any]:
    seen: set[str] = set()
    for value in values:
        marker = json.dumps(value, sort_keys=True, default=str)
        if marker in seen:
            raise ValueError(f"duplicate value {value!r}")
        seen.add(marker)
    return values


def power_of_two(values: list[int] | None) -> list[int] | None:
    for value in values or []:
        if value & (value - 1):
            raise ValueError(f"{value} is not a power of two")
    return values


def _gpu_name(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return lookup_gpu(value).sku
        except UnknownGpuError as exc:
            raise ValueError(str(exc)) from exc
    return value


GpuName = Annotated[str, BeforeValidator(_gpu_name)]
Count = Annotated[int, Field(gt=0, le=_INT32_MAX)]


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True)
