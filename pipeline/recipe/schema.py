"""The recipe: one model, a matrix of targets, and the settings of each stage (the sections
after `model` and `matrix`, and `Recipe`, the whole document)."""

from __future__ import annotations

import itertools
import math
import re
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from pipeline.recipe.fields import (
    MAX_CAPACITY_ROUNDS,
    MAX_FILTERS,
    MAX_LEVELS,
    MAX_SMOKE_ITEMS,
    GpuName,
    Runtime,
    StrictModel,
    unique,
)
from pipeline.recipe.matrix import AxisSelection, Matrix
from pipeline.recipe.model import ModelSpec
from pipeline.recipe.toolchain_fields import TOOLCHAIN_FIELDS, ToolchainField


class Calibration(StrictModel):
    dataset: str | None = None
    file: str | None = None
    digest: str | None = None
    samples: int = Field(default=512, gt=0)
    seq_len: int = Field(default=512, gt=0)
    batch_size: int = Field(default=1, gt=0)

    @model_validator(mode="after")
    def _one_source(self) -> Calibration:
        if (self.dataset is None) == (self.file is None):
            raise ValueError("give exactly one of 'dataset' (a named dataset) or 'file'")
        if self.file is not None and self.digest is None:
            raise ValueError(f"file {self.file!r} needs 'digest' (sha256:<hex> of its bytes)")
        if self.digest is not None and not re.fullmatch(r"sha256:[0-9a-f]{64}", self.digest):
            raise ValueError(f"digest {self.digest!r} is not sha256:<64 hex>")
        return self


class QuantizeSettings(StrictModel):
    calibration: Calibration = Calibration(dataset="cnn_dailymail")
    awq_block_size: Literal[64, 128] = 128
    timeout_s: int = Field(default=4 * 3600, gt=0)


OnOff = Literal["enable", "disable"]


class BuildSettings(StrictModel):
    """trtllm-build settings; defaults are what TRT-LLM users run today."""

    gemm_plugin: Literal["auto", "disable", "float16", "bfloat16", "fp8"] = "auto"
    gpt_attention_plugin: Literal["auto", "float16", "bfloat16"] = "auto"
    use_paged_context_fmha: OnOff = "enable"
    use_fp8_context_fmha: Literal["auto", "enable", "disable"] = "auto"
    multiple_profiles: OnOff = "enable"
    reduce_fusion: OnOff = "disable"
    remove_input_padding: OnOff = "enable"
    max_beam_width: int = Field(default=1, gt=0)
    strip_plan: bool = False
    """Build weight-stripped engines (`trtllm-build --strip_plan`), refitted from their
    checkpoint where they serve (smoke, pull). Off by default: a node then needs
    `trtllm-refit` and a GPU-side refit before it serves, and the first build of each
    (model, quant, TRT-LLM) in a pool is built whole once more to prove the refit."""
    workers: int = Field(default=1, gt=0)
    timeout_s: int = Field(default=4 * 3600, gt=0)


class TrtllmServe(StrictModel):
    kv_cache_free_gpu_memory_fraction: float = Field(default=0.9, gt=0, le=1)


class VllmServe(StrictModel):
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    enforce_eager: bool = False
    quantization: Literal["auto", "online", "checkpoint"] = "auto"


class ServeSettings(StrictModel):
    trtllm: TrtllmServe | None = None
    trtllm_pytorch: TrtllmServe | None = Field(default=None, alias="trtllm-pytorch")
    vllm: VllmServe | None = None

    @model_validator(mode="after")
    def _some_runtime(self) -> ServeSettings:
        for name in self.model_fields_set:
            if getattr(self, name) is None:
                alias = type(self).model_fields[name].alias or name
                raise ValueError(f"'{alias}' is empty; write '{alias}: {{}}' for its defaults")
        if not self.model_fields_set:
            raise ValueError("name at least one runtime: trtllm, trtllm-pytorch or vllm")
        return self

    @property
    def runtimes(self) -> list[Runtime]:
        chosen: list[Runtime] = []
        if self.trtllm is not None:
            chosen.append("trtllm")
        if self.trtllm_pytorch is not None:
            chosen.append("trtllm-pytorch")
        if self.vllm is not None:
            chosen.append("vllm")
        return chosen


class Reference(StrictModel):
    """A prompt and the text its greedy `max_tokens`-token completion must be (e.g. what the
    unquantized model gives under transformers)."""

    prompt: str
    output: str


class CapacitySettings(StrictModel):
    """The open-loop capacity curve a smoke measures when the recipe asks (`smoke.capacity`,
    `pipeline.serving.openloop`): Poisson arrivals at each of *rates* (requests/s, ascending)
    for *duration_s* seconds each, with the smoke's prompts and `max_tokens`, until TTFT p95
    passes *ttft_p95_ms* or TPOT p95 passes *tpot_p95_ms* (or requests fail); *rounds* times
    over, interleaved (`pipeline.serving.capacity`). `{}` takes the defaults: 1 to 32
    requests/s doubling, 5 s each, ceilings 2000 ms and 200 ms, 3 rounds."""

    rates: Annotated[
        list[Annotated[float, Field(gt=0, le=100_000)]], Field(min_length=1, max_length=MAX_LEVELS)
    ] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0]  # noqa: RUF012 - pydantic copies defaults
    duration_s: float = Field(default=5.0, gt=0, le=3600)
    ttft_p95_ms: float = Field(default=2000.0, gt=0, le=3_600_000)
    tpot_p95_ms: float = Field(default=200.0, gt=0, le=3_600_000)
    seed: int = Field(default=0, ge=0)
    rounds: int = Field(default=3, ge=1, le=MAX_CAPACITY_ROUNDS)

    @field_validator("rates")
    @classmethod
    def _ascending(cls, rates: list[float]) -> list[float]:
        if any(later <= earlier for earlier, later in itertools.pairwise(rates)):
            raise ValueError(f"rates must rise, one after another: {rates}")
        return rates


class SmokeSettings(StrictModel):
    prompts: list[str] = Field(
        default=["The capital of France is", "Write a haiku about GPUs."], min_length=1,
        max_length=MAX_SMOKE_ITEMS,
    )
    max_tokens: int = Field(default=32, gt=0)
    concurrency: Annotated[
        list[Annotated[int, Field(gt=0)]], Field(min_length=1, max_length=MAX_LEVELS)
    ] = [1, 4, 16]  # noqa: RUF012 - pydantic copies defaults
    requests: int = Field(default=32, gt=0)
    ready_timeout_s: int = Field(default=900, gt=0)
    request_timeout_s: int = Field(default=120, gt=0)
    gpu_price_per_hour: Annotated[dict[GpuName, float], Field(max_length=MAX_SMOKE_ITEMS)] = {}  # noqa: RUF012 - pydantic copies defaults
    # exact for bf16/fp16 targets; quantized: by agreement
    reference: Annotated[list[Reference], Field(max_length=MAX_SMOKE_ITEMS)] = []  # noqa: RUF012 - pydantic copies defaults
    reference_agreement: float = Field(default=0.9, gt=0, le=1)
    capacity: CapacitySettings | None = None  # None: no open-loop curve (CapacitySettings)

    @field_validator("gpu_price_per_hour")
    @classmethod
    def _non_negative(cls, prices: dict[str, float]) -> dict[str, float]:
        for gpu, price in prices.items():
            if not math.isfinite(price):
                raise ValueError(f"price for {gpu} is not a number: {price}")
            if price < 0:
                raise ValueError(f"price for {gpu} is negative: {price}")
        return prices


class ToolchainPins(StrictModel):
    """The toolchain a recipe expects its builders to have; unset parts use the builder image."""

    trtllm: str | None = None
    tensorrt: str | None = None
    cuda: str | None = None
    driver: str | None = None
    modelopt: str | None = None
    torch: str | None = None
    transformers: str | None = None
    vllm: str | None = None
    image: str | None = None
    rebuild_on: list[ToolchainField] = list(TOOLCHAIN_FIELDS)  # noqa: RUF012 - pydantic copies defaults

    @field_validator("rebuild_on")
    @classmethod
    def _no_repeats(cls, values: list[str]) -> list[str]:
        return unique(values)


PLACEHOLDERS: tuple[str, ...] = ("model", "gpu", "quant", "runtime", "shape", "tp")
_PLACEHOLDER = re.compile(r"{([^{}]*)}")


class PromoteMatch(AxisSelection):
    """Which targets a promotion channel follows (none named: every target)."""


class Promotion(StrictModel):
    """One promotion channel: the alias (with placeholders) that follows the targets
    *match* selects, moved only to an artifact no slower than *max_regression* allows."""

    alias: str = Field(min_length=1, max_length=255)
    match: PromoteMatch = PromoteMatch()
    max_regression: float = Field(default=0.05, ge=0, lt=1)

    @field_validator("alias")
    @classmethod
    def _known_placeholders(cls, alias: str) -> str:
        for name in _PLACEHOLDER.findall(alias):
            if name not in PLACEHOLDERS:
                known = ", ".join("{" + p + "}" for p in PLACEHOLDERS)
                raise ValueError(f"unknown placeholder {{{name}}} in {alias!r}; the "
                                 f"placeholders are {known}")
        return alias


class NightlySettings(StrictModel):
    """What `enginectl nightly` judges the recipe's targets by: a re-proof slower than its
    last proof on the previous toolchain by more than *max_regression* is a toolchain
    regression (`pipeline.nightly.alarm`). *gate_rounds*: how many rounds each side of the
    promotion gate's same-run A/B is measured (`pipeline.serving.abgate`), and how many more a
    re-proof is measured when its smoke alone fell below the alarm's line."""

    max_regression: float = Field(default=0.10, ge=0, lt=1)
    gate_rounds: int = Field(default=3, ge=1, le=20)


class Recipe(StrictModel):
    name: str | None = None
    model: ModelSpec
    matrix: Matrix
    quantize: QuantizeSettings = QuantizeSettings()
    build: BuildSettings = BuildSettings()
    serve: ServeSettings = ServeSettings(trtllm=TrtllmServe())
    smoke: SmokeSettings = SmokeSettings()
    toolchain: ToolchainPins = ToolchainPins()
    promote: Annotated[list[Promotion], Field(max_length=MAX_FILTERS)] = []  # noqa: RUF012 - pydantic copies defaults
    nightly: NightlySettings = NightlySettings()

    @property
    def display_name(self) -> str:
        return self.name or self.model.name

