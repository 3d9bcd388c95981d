"""The toolchain fields a recipe pins (`toolchain:`) and rebuilds on (`rebuild_on`), apart
from the schema: planning's toolchain module keys with them on paths that read no recipe
(`resolve --gpu auto`, `info`), which so never import pydantic."""

from __future__ import annotations

from typing import Literal

ToolchainField = Literal[
    "driver", "cuda", "tensorrt", "trtllm", "image", "modelopt", "torch", "transformers", "vllm"
]
TOOLCHAIN_FIELDS: tuple[ToolchainField, ...] = (
    "driver", "cuda", "tensorrt", "trtllm", "image", "modelopt", "torch", "transformers", "vllm"
)
