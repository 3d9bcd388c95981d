"""The recipe: one model, a matrix of targets, and the settings of each stage.

`load_recipe` is the one reader. It turns YAML syntax errors, duplicate keys and
`pydantic.ValidationError`s into a `RecipeError` naming the file, the field path, the YAML
line and the bad value, with a "did you mean" for misspelt keys.

A recipe is a few KB. What `plan` does with one is bounded, so that it answers in well under
a second for anything accepted (bench/README.md, `plan_speed.py`): the file is at most
MAX_RECIPE_BYTES (PyYAML reads ~2 MB/s of dense YAML), every list has a cap (MAX_AXIS values
per matrix axis, MAX_SHAPES shapes, MAX_FILTERS exclude or include entries, MAX_SMOKE_ITEMS
prompts, references and prices, MAX_LEVELS concurrency levels), and the matrix makes at most
MAX_TARGETS targets.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from pipeline.errors import RecipeError
from registry.canonical import floats_as_strings
from registry.digest import sha256_of, sha256_of_json, tree_digest
from registry.errors import did_you_mean
from registry.gpus import UnknownGpuError, lookup_gpu

Quant = Literal["bf16", "fp16", "fp8", "int4_awq", "int8_sq", "w4a8_awq", "nvfp4"]
KvCacheDtype = Literal["auto", "fp8", "int8"]
Runtime = Literal["trtllm", "trtllm-pytorch", "vllm"]
ModelDtype = Literal["bfloat16", "float16"]
ToolchainField = Literal[
    "driver", "cuda", "tensorrt", "trtllm", "image", "modelopt", "torch", "transformers", "vllm"
]
TOOLCHAIN_FIELDS: tuple[ToolchainField, ...] = (
    "driver", "cuda", "tensorrt", "trtllm", "image", "modelopt", "torch", "transformers", "vllm"
)

QUANTS: tuple[Quant, ...] = ("bf16", "fp16", "fp8", "int4_awq", "int8_sq", "w4a8_awq", "nvfp4")
RUNTIMES: tuple[Runtime, ...] = ("trtllm", "trtllm-pytorch", "vllm")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
# Model sizes and shapes are int32 in TensorRT-LLM; the bound also keeps the memory math finite.
_INT32_MAX = 2**31 - 1
_GOT_MAX = 80  # characters of a bad value quoted in a message

MAX_RECIPE_BYTES = 256 * 1024
MAX_AXIS = 16  # values of a matrix axis (the GPU catalog has fewer SKUs)
MAX_SHAPES = 64
MAX_FILTERS = 64  # exclude or include entries
MAX_SMOKE_ITEMS = 64  # prompts, reference outputs, GPU prices
MAX_LEVELS = 16  # smoke concurrency levels: each is a load run
MAX_TARGETS = 512  # before exclude, includes added: plan keys ~2000 targets a second


def _as_list(value: Any) -> Any:
    """Matrix axes accept a scalar as a one-element list: `tp: 8` means `tp: [8]`."""
    return value if isinstance(value, list) else [value]


def _unique(values: list[Any]) -> list[Any]:
    seen: set[str] = set()
    for value in values:
        marker = json.dumps(value, sort_keys=True, default=str)
        if marker in seen:
            raise ValueError(f"duplicate value {value!r}")
        seen.add(marker)
    return values


def _power_of_two(values: list[int] | None) -> list[int] | None:
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


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True)


class Architecture(_Model):
    """What the memory math needs. Read from config.json for local sources."""

    family: str = "llama"
    num_layers: Count
    hidden_size: Count
    intermediate_size: Count
    num_attention_heads: Count
    num_key_value_heads: Count
    vocab_size: Count
    head_dim: Count | None = None
    tie_word_embeddings: bool = False
    max_position_embeddings: Count | None = None

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @model_validator(mode="after")
    def _heads_divide(self) -> Architecture:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads {self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads {self.num_key_value_heads}"
            )
        if self.resolved_head_dim == 0:
            raise ValueError(
                f"hidden_size {self.hidden_size} / num_attention_heads "
                f"{self.num_attention_heads} leaves no head_dim; set head_dim"
            )
        return self


class ModelSpec(_Model):
    name: str
    source: str
    # hf:// only: resolve a branch or tag to its commit when the recipe is read, and record
    # that commit (otherwise a branch is refused: keys must name what was built)
    resolve_revision: bool = False
    revision: str | None = Field(default=None, validate_default=True)
    dtype: ModelDtype = "bfloat16"
    architecture: Architecture | None = None

    @field_validator("name")
    @classmethod
    def _slug(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(f"{value!r} is not a name (lowercase letters, digits, '.', '_', '-')")
        return value

    @field_validator("source")
    @classmethod
    def _source_form(cls, value: str) -> str:
        if value.startswith("hf://"):
            if not re.fullmatch(r"hf://[\w.-]+/[\w.-]+", value):
                raise ValueError(f"{value!r} is not hf://org/repo")
        elif value.startswith("s3://"):
            if not re.fullmatch(r"s3://[a-z0-9.-]{3,63}(/.*)?", value):
                raise ValueError(f"{value!r} is not s3://bucket/prefix")
        elif "://" in value and not value.startswith("file://"):
            raise ValueError(f"{value!r}: use hf://org/repo, s3://bucket/prefix or a local path")
        return value

    @field_validator("revision")
    @classmethod
    def _pinned(cls, revision: str | None, info: ValidationInfo) -> str | None:
        source = info.data.get("source")  # absent when the source itself is invalid
        if not isinstance(source, str):
            return revision
        if source.startswith("hf://"):
            if revision is None:
                raise ValueError(
                    f"source {source!r} needs 'revision': the 40-hex commit to build from"
                )
            if not _COMMIT.match(revision) and not info.data.get("resolve_revision"):
                raise ValueError(
                    f"revision {revision!r} is not a 40-hex commit; pin the commit, not a branch"
                    " (or set resolve_revision: true to record the branch's commit)"
                )
        elif source.startswith("s3://") and not revision:
            raise ValueError(f"source {source!r} needs 'revision' (a version you pin)")
        return revision

    @property
    def is_local(self) -> bool:
        return not self.source.startswith(("hf://", "s3://"))


class Shape(_Model):
    name: str | None = None
    max_batch_size: Count
    max_input_len: Count
    max_seq_len: Count
    max_num_tokens: Count | None = None

    @property
    def label(self) -> str:
        return self.name or f"b{self.max_batch_size}-i{self.max_input_len}-s{self.max_seq_len}"

    @model_validator(mode="after")
    def _consistent(self) -> Shape:
        if self.max_input_len > self.max_seq_len:
            raise ValueError(
                f"max_input_len {self.max_input_len} > max_seq_len {self.max_seq_len}; "
                "the prompt must leave room to generate"
            )
        if self.max_num_tokens is not None and self.max_num_tokens > (
            self.max_batch_size * self.max_seq_len
        ):
            raise ValueError(
                f"max_num_tokens {self.max_num_tokens} exceeds max_batch_size × max_seq_len "
                f"({self.max_batch_size * self.max_seq_len})"
            )
        if self.name is not None and not _NAME.match(self.name):
            raise ValueError(f"shape name {self.name!r} is not a name")
        return self


_AXIS = Field(min_length=1, max_length=MAX_AXIS)
_SHAPES = Field(min_length=1, max_length=MAX_SHAPES)


class AxisSelection(_Model):
    """Targets picked by matrix axes: each axis a value or a list of values; an axis left
    out matches any value (`pipeline.targets.selects`)."""

    gpu: Annotated[list[GpuName], BeforeValidator(_as_list), _AXIS] | None = None
    tp: Annotated[list[Count], BeforeValidator(_as_list), _AXIS] | None = None
    pp: Annotated[list[Count], BeforeValidator(_as_list), _AXIS] | None = None
    quant: Annotated[list[Quant], BeforeValidator(_as_list), _AXIS] | None = None
    kv_cache_dtype: Annotated[list[KvCacheDtype], BeforeValidator(_as_list), _AXIS] | None = None
    shape: Annotated[list[str], BeforeValidator(_as_list), _SHAPES] | None = None
    runtime: Annotated[list[Runtime], BeforeValidator(_as_list), _AXIS] | None = None

    @field_validator("gpu", "tp", "pp", "quant", "kv_cache_dtype", "shape", "runtime")
    @classmethod
    def _no_repeats(cls, values: list[Any] | None) -> list[Any] | None:
        return None if values is None else _unique(values)

    @field_validator("tp", "pp")
    @classmethod
    def _parallel(cls, values: list[int] | None) -> list[int] | None:
        return _power_of_two(values)


class MatrixFilter(AxisSelection):
    """An `exclude` or `include` entry (at least one axis named)."""

    @model_validator(mode="after")
    def _not_empty(self) -> MatrixFilter:
        if all(getattr(self, name) is None for name in type(self).model_fields):
            raise ValueError("an empty entry matches everything; name at least one axis")
        return self


class Matrix(_Model):
    gpu: Annotated[list[GpuName], BeforeValidator(_as_list), _AXIS]
    tp: Annotated[list[Count], BeforeValidator(_as_list), _AXIS] = [1]
    pp: Annotated[list[Count], BeforeValidator(_as_list), _AXIS] = [1]
    quant: Annotated[list[Quant], BeforeValidator(_as_list), _AXIS] = ["bf16"]
    kv_cache_dtype: Annotated[list[KvCacheDtype], BeforeValidator(_as_list), _AXIS] = ["auto"]
    shape: Annotated[list[Shape], BeforeValidator(_as_list), _SHAPES]
    exclude: Annotated[list[MatrixFilter], Field(max_length=MAX_FILTERS)] = []
    include: Annotated[list[MatrixFilter], Field(max_length=MAX_FILTERS)] = []

    @field_validator("gpu", "tp", "pp", "quant", "kv_cache_dtype")
    @classmethod
    def _no_repeats(cls, values: list[Any]) -> list[Any]:
        return _unique(values)

    @field_validator("tp", "pp")
    @classmethod
    def _parallel(cls, values: list[int]) -> list[int]:
        _power_of_two(values)
        return values

    @field_validator("shape")
    @classmethod
    def _unique_shapes(cls, shapes: list[Shape]) -> list[Shape]:
        seen: set[str] = set()
        for shape in shapes:
            if shape.label in seen:
                raise ValueError(f"two shapes are named {shape.label!r}")
            seen.add(shape.label)
        return shapes

    def size(self, runtimes: int) -> int:
        """How many targets the matrix makes with *runtimes* runtimes, before `exclude`,
        with what each `include` entry adds."""
        def product(entry: MatrixFilter | None, runtime_count: int) -> int:
            count = runtime_count
            for name in ("gpu", "tp", "pp", "quant", "kv_cache_dtype", "shape"):
                chosen = getattr(entry, name, None) if entry is not None else None
                count *= len(chosen if chosen is not None else getattr(self, name))
            return count

        return product(None, runtimes) + sum(
            product(entry, len(entry.runtime) if entry.runtime else runtimes)
            for entry in self.include)


class Calibration(_Model):
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


class QuantizeSettings(_Model):
    calibration: Calibration = Calibration(dataset="cnn_dailymail")
    awq_block_size: Literal[64, 128] = 128
    timeout_s: int = Field(default=4 * 3600, gt=0)


OnOff = Literal["enable", "disable"]


class BuildSettings(_Model):
    """trtllm-build settings; defaults are what TRT-LLM users run today."""

    gemm_plugin: Literal["auto", "disable", "float16", "bfloat16", "fp8"] = "auto"
    gpt_attention_plugin: Literal["auto", "float16", "bfloat16"] = "auto"
    use_paged_context_fmha: OnOff = "enable"
    use_fp8_context_fmha: Literal["auto", "enable", "disable"] = "auto"
    multiple_profiles: OnOff = "enable"
    reduce_fusion: OnOff = "disable"
    remove_input_padding: OnOff = "enable"
    max_beam_width: int = Field(default=1, gt=0)
    workers: int = Field(default=1, gt=0)
    timeout_s: int = Field(default=4 * 3600, gt=0)


class TrtllmServe(_Model):
    kv_cache_free_gpu_memory_fraction: float = Field(default=0.9, gt=0, le=1)


class VllmServe(_Model):
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    enforce_eager: bool = False
    quantization: Literal["auto", "online", "checkpoint"] = "auto"


class ServeSettings(_Model):
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


class Reference(_Model):
    """A prompt and the text its greedy `max_tokens`-token completion must be (e.g. what the
    unquantized model gives under transformers)."""

    prompt: str
    output: str


class SmokeSettings(_Model):
    prompts: list[str] = Field(
        default=["The capital of France is", "Write a haiku about GPUs."], min_length=1,
        max_length=MAX_SMOKE_ITEMS,
    )
    max_tokens: int = Field(default=32, gt=0)
    concurrency: Annotated[
        list[Annotated[int, Field(gt=0)]], Field(min_length=1, max_length=MAX_LEVELS)
    ] = [1, 4, 16]
    requests: int = Field(default=32, gt=0)
    ready_timeout_s: int = Field(default=900, gt=0)
    request_timeout_s: int = Field(default=120, gt=0)
    gpu_price_per_hour: Annotated[dict[GpuName, float], Field(max_length=MAX_SMOKE_ITEMS)] = {}
    # exact for bf16/fp16 targets; quantized: by agreement
    reference: Annotated[list[Reference], Field(max_length=MAX_SMOKE_ITEMS)] = []
    reference_agreement: float = Field(default=0.9, gt=0, le=1)

    @field_validator("gpu_price_per_hour")
    @classmethod
    def _non_negative(cls, prices: dict[str, float]) -> dict[str, float]:
        for gpu, price in prices.items():
            if not math.isfinite(price):
                raise ValueError(f"price for {gpu} is not a number: {price}")
            if price < 0:
                raise ValueError(f"price for {gpu} is negative: {price}")
        return prices


class ToolchainPins(_Model):
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
    rebuild_on: list[ToolchainField] = list(TOOLCHAIN_FIELDS)

    @field_validator("rebuild_on")
    @classmethod
    def _no_repeats(cls, values: list[str]) -> list[str]:
        return _unique(values)


PLACEHOLDERS: tuple[str, ...] = ("model", "gpu", "quant", "runtime", "shape", "tp")
_PLACEHOLDER = re.compile(r"{([^{}]*)}")


class PromoteMatch(AxisSelection):
    """Which targets a promotion channel follows (none named: every target)."""


class Promotion(_Model):
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


class Recipe(_Model):
    name: str | None = None
    model: ModelSpec
    matrix: Matrix
    quantize: QuantizeSettings = QuantizeSettings()
    build: BuildSettings = BuildSettings()
    serve: ServeSettings = ServeSettings(trtllm=TrtllmServe())
    smoke: SmokeSettings = SmokeSettings()
    toolchain: ToolchainPins = ToolchainPins()
    promote: Annotated[list[Promotion], Field(max_length=MAX_FILTERS)] = []

    @property
    def display_name(self) -> str:
        return self.name or self.model.name


# ---- the reader -----------------------------------------------------------------------------


class LoadedRecipe(BaseModel):
    """A validated recipe plus where it came from and what the checkpoint says about itself."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    path: Path
    text: str
    recipe: Recipe
    architecture: Architecture
    source_digest: str | None  # content of a local source directory
    revision: str | None  # the commit an hf:// source is pinned or resolved to
    calibration_file: Path | None  # the calibration file, resolved and digest-checked
    node: Any = Field(default=None, exclude=True, repr=False)  # the composed YAML, for lines

    @property
    def base_dir(self) -> Path:
        return self.path.parent

    def line_of(self, *loc: int | str) -> int | None:
        """The YAML line of the field at *loc*, e.g. `line_of("matrix", "exclude", 0)`."""
        node = self.node if self.node is not None else yaml.compose(self.text,
                                                                     Loader=yaml.SafeLoader)
        return _line_of(node, loc)

    @property
    def digest(self) -> str:
        """Identity of what the recipe says, not how it is written (comments, key order)."""
        # a recipe without promotion channels keeps the digest it had before they existed
        exclude = None if self.recipe.promote else {"promote"}
        return str(sha256_of_json(floats_as_strings(
            self.recipe.model_dump(mode="json", exclude=exclude))))


def _one_line(text: object) -> str:
    """Messages are one line: third-party text (YAML marks, OS errors) may span several."""
    return " ".join(str(text).split())


def _quote(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _GOT_MAX else text[: _GOT_MAX - 1] + "…"


# libyaml's parser (PyYAML's C extension) composes ~3x faster, and skips comments ~50x
# faster, than PyYAML's own: it reads what it can; anything it refuses, and any character
# PyYAML's reader refuses, goes to PyYAML's own parser, which words every error message.
_FAST_LOADER: type[yaml.SafeLoader] | None = getattr(yaml, "CSafeLoader", None)


def _fast_node(text: str) -> tuple[Any, yaml.Node | None] | None:
    """(loader, node) from libyaml, or None to take PyYAML's own way."""
    if _FAST_LOADER is None or yaml.reader.Reader.NON_PRINTABLE.search(text):
        return None
    loader = _FAST_LOADER(text)
    try:
        return loader, loader.get_single_node()
    except (yaml.YAMLError, ValueError, RecursionError):
        loader.dispose()
        return None


def _compose(path: Path, text: str) -> tuple[Any, yaml.Node | None]:
    loader = None
    try:
        fast = _fast_node(text)
        if fast is not None:
            loader, node = fast
        else:
            loader = yaml.SafeLoader(text)  # checks for unprintable characters already
            node = loader.get_single_node()
        if node is None:
            return None, None
        _reject_duplicate_keys(path, node, (), set())
        return loader.construct_document(node), node
    except yaml.MarkedYAMLError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark else None
        context = ""
        if exc.context:
            started = f" started at line {exc.context_mark.line + 1}" if exc.context_mark else ""
            context = f"{exc.context}{started}: "
        problem = _one_line(f"{context}{exc.problem}")
        raise RecipeError(path, f"YAML syntax error: {problem}", line=line) from exc
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow
        line = text.count("\n", 0, exc.position) + 1
        raise RecipeError(
            path, f"YAML error: character #x{exc.character:04x}: {exc.reason}", line=line
        ) from exc
    except yaml.YAMLError as exc:
        raise RecipeError(path, f"YAML error: {_one_line(exc)}") from exc
    except RecursionError as exc:
        raise RecipeError(path, "YAML nested too deeply for a recipe") from exc
    except ValueError as exc:  # a scalar Python cannot hold, e.g. an int of 5000 digits
        raise RecipeError(path, f"YAML value error: {_one_line(exc)}") from exc
    finally:
        if loader is not None:
            loader.dispose()


def _reject_duplicate_keys(
    path: Path, node: yaml.Node, loc: tuple[int | str, ...], seen_nodes: set[int]
) -> None:
    if id(node) in seen_nodes:  # an alias: checked where its anchor is (and may be recursive)
        return
    seen_nodes.add(id(node))
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = str(key_node.value)
            if key in seen:
                raise RecipeError(
                    path,
                    f"duplicate key {_quote(key)}",
                    field=_field_path((*loc, key)),
                    line=key_node.start_mark.line + 1,
                )
            seen.add(key)
            _reject_duplicate_keys(path, value_node, (*loc, key), seen_nodes)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _reject_duplicate_keys(path, item, (*loc, index), seen_nodes)


def _line_of(node: yaml.Node | None, loc: tuple[int | str, ...]) -> int | None:
    """The YAML line of the deepest node along *loc* (1-based), or None."""
    line = None if node is None else node.start_mark.line + 1
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = next((kv for kv in node.value if str(kv[0].value) == str(part)), None)
            if match is None:
                break
            line = match[0].start_mark.line + 1
            node = match[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if part >= len(node.value):
                break
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return line


_PLAIN_KEY = re.compile(r"[A-Za-z_][\w-]*")


def _field_path(loc: tuple[int | str, ...]) -> str:
    """`matrix.shape[0].max_batch`; a key that is not a plain word is quoted: `smoke['a b']`."""
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        elif part == "[key]":  # pydantic's marker for an error in a mapping's key
            text += " (key)"
        elif not _PLAIN_KEY.fullmatch(part):
            text += f"[{_quote(part)}]"
        else:
            text += f".{part}" if text else part
    return text or "(top level)"


def _known_keys(model: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """The keys allowed at *loc* (for "did you mean"), walking the pydantic models."""
    current: Any = model
    for part in loc:
        if isinstance(part, int) or not _is_model(current):
            continue
        field = current.model_fields.get(part) or next(
            (f for f in current.model_fields.values() if f.alias == part), None
        )
        if field is None:
            return []
        current = _model_in(field.annotation)
    if _is_model(current):
        return [f.alias or name for name, f in current.model_fields.items()]
    return []


def _is_model(value: Any) -> bool:
    return isinstance(value, type) and issubclass(value, BaseModel)


def _model_in(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


_KEY_ERRORS = ("extra_forbidden", "invalid_key")


def _explain(path: Path, node: yaml.Node | None, exc: ValidationError) -> RecipeError:
    # A misspelt key comes first: it is what also makes the right key "missing".
    error = sorted(exc.errors(), key=lambda e: e["type"] not in _KEY_ERRORS)[0]
    loc = tuple(error["loc"])
    kind = error["type"]
    if kind == "extra_forbidden":
        parent, key = loc[:-1], str(loc[-1])
        hint = did_you_mean(key, _known_keys(Recipe, parent))
        return RecipeError(
            path, f"unknown key {_quote(key)}{hint}", field=_field_path(loc),
            line=_line_of(node, loc),
        )
    if kind == "invalid_key":
        return RecipeError(
            path, f"keys are strings, not {_quote(error.get('input'))}",
            field=_field_path(loc[:-1]), line=_line_of(node, loc[:-1]),
        )
    if kind == "missing":
        return RecipeError(
            path, "required field is missing", field=_field_path(loc), line=_line_of(node, loc[:-1])
        )
    message = _one_line(error["msg"].removeprefix("Value error, "))
    value = error.get("input")
    if kind.endswith("_type") or kind.startswith(("literal", "greater", "less", "too_")):
        message = f"{message} (got {_quote(value)})"
    return RecipeError(path, message, field=_field_path(loc), line=_line_of(node, loc))


def read_config_architecture(model_dir: Path) -> Architecture:
    """Architecture facts from a Hugging Face config.json."""
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    text_config = config.get("text_config", config) if isinstance(config, dict) else None
    if not isinstance(text_config, dict):
        raise TypeError("config.json (or its text_config) is not a JSON object")
    architectures = config.get("architectures") or ["LlamaForCausalLM"]
    family = re.sub(r"For(CausalLM|ConditionalGeneration)$", "", architectures[0]).lower()
    heads = text_config["num_attention_heads"]
    return Architecture(
        family=family,
        num_layers=text_config["num_hidden_layers"],
        hidden_size=text_config["hidden_size"],
        intermediate_size=text_config["intermediate_size"],
        num_attention_heads=heads,
        num_key_value_heads=text_config.get("num_key_value_heads") or heads,
        vocab_size=text_config["vocab_size"],
        head_dim=text_config.get("head_dim"),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        max_position_embeddings=text_config.get("max_position_embeddings"),
    )


def _expand(raw: str, base_dir: Path) -> Path:
    """*raw* with `~` expanded (where it names a home) and made relative to *base_dir*."""
    path = Path(raw)
    with contextlib.suppress(RuntimeError):  # `~nobody`: left as written, then not found
        path = path.expanduser()
    return path if path.is_absolute() else (base_dir / path)


def local_source_dir(recipe: Recipe, base_dir: Path) -> Path:
    return _expand(recipe.model.source.removeprefix("file://"), base_dir)


def _architecture(path: Path, recipe: Recipe, node: yaml.Node | None) -> Architecture:
    declared = recipe.model.architecture
    if not recipe.model.is_local:
        if declared is None:
            raise RecipeError(
                path,
                f"{recipe.model.source!r} is not local, so declare the architecture "
                "(num_layers, hidden_size, ...) in the recipe",
                field="model.architecture",
                line=_line_of(node, ("model",)),
            )
        return declared
    model_dir = local_source_dir(recipe, path.parent)
    line = _line_of(node, ("model", "source"))
    if not (model_dir / "config.json").is_file():
        raise RecipeError(
            path,
            f"local model directory {str(model_dir)!r} has no config.json",
            field="model.source",
            line=line,
        )
    config = model_dir / "config.json"
    try:
        found = read_config_architecture(model_dir)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise RecipeError(
            path,
            f"{str(config)!r}: {_field_path(tuple(first['loc']))}: {_one_line(first['msg'])} "
            f"(got {_quote(first.get('input'))})",
            field="model.source",
            line=line,
        ) from exc
    except KeyError as exc:
        raise RecipeError(
            path, f"{str(config)!r} has no {exc.args[0]!r}", field="model.source", line=line
        ) from exc
    except (OSError, ValueError, TypeError, IndexError) as exc:
        raise RecipeError(
            path,
            f"cannot read {str(config)!r}: {_one_line(exc)}",
            field="model.source",
            line=line,
        ) from exc
    if declared is not None and declared != found:
        diff = [
            f"{name}: recipe {getattr(declared, name)!r}, config.json {getattr(found, name)!r}"
            for name in Architecture.model_fields
            if getattr(declared, name) != getattr(found, name)
        ]
        raise RecipeError(
            path,
            f"does not match config.json ({'; '.join(diff)})",
            field="model.architecture",
            line=_line_of(node, ("model", "architecture")),
        )
    return found


def parse_recipe(path: Path, text: str) -> LoadedRecipe:
    """Validate recipe *text* (read from *path*); raise RecipeError on any problem."""
    if len(text) > MAX_RECIPE_BYTES:  # characters: never fewer than the bytes they came from
        _too_big(path, len(text.encode("utf-8", errors="surrogatepass")))
    data, node = _compose(path, text)
    if data is None:
        raise RecipeError(path, "the recipe is empty")
    if not isinstance(data, dict):
        raise RecipeError(path, f"a recipe is a mapping, not {type(data).__name__}", line=1)
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as exc:
        raise _explain(path, node, exc) from exc
    targets = recipe.matrix.size(len(recipe.serve.runtimes))
    if targets > MAX_TARGETS:
        raise RecipeError(
            path, f"the matrix makes {targets} targets (its axes multiplied, times "
            f"{len(recipe.serve.runtimes)} runtimes, plus the includes); the limit is "
            f"{MAX_TARGETS}: split it into several recipes or narrow an axis",
            field="matrix", line=_line_of(node, ("matrix",)),
        )
    architecture = _architecture(path, recipe, node)
    source_digest = None
    if recipe.model.is_local:
        try:
            source_digest = str(tree_digest(local_source_dir(recipe, path.parent)))
        except (OSError, ValueError) as exc:
            raise RecipeError(
                path,
                f"cannot read the local model: {_one_line(exc)}",
                field="model.source",
                line=_line_of(node, ("model", "source")),
            ) from exc
    return LoadedRecipe(
        path=path,
        text=text,
        recipe=recipe,
        revision=_revision(path, recipe, _line_of(node, ("model", "revision"))),
        architecture=architecture,
        source_digest=source_digest,
        calibration_file=_calibration_file(path, recipe.quantize.calibration, node),
        node=node,
    )


def _revision(path: Path, recipe: Recipe, line: int | None) -> str | None:
    """The commit to build from: the pinned one, or, with resolve_revision, what the
    branch or tag points at now (asked of the hub; recorded in the snapshot key)."""
    model = recipe.model
    if not model.source.startswith("hf://") or model.revision is None:
        return model.revision
    if _COMMIT.match(model.revision):
        return model.revision
    from huggingface_hub import HfApi

    repo = model.source.removeprefix("hf://")
    try:
        sha = HfApi().model_info(repo, revision=model.revision).sha
    except Exception as exc:  # hub, network and offline errors share no useful base
        raise RecipeError(
            path, f"cannot resolve {model.revision!r} of {repo} to a commit: "
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}; "
            "pin the commit instead", field="model.revision", line=line,
        ) from exc
    if not sha or not _COMMIT.match(sha):
        raise RecipeError(path, f"the hub gave no commit for {model.revision!r} of {repo}",
                          field="model.revision", line=line)
    return sha


def _calibration_file(
    path: Path, calibration: Calibration, node: yaml.Node | None
) -> Path | None:
    if calibration.file is None:
        return None
    file = _expand(calibration.file, path.parent)
    field = "quantize.calibration.file"
    line = _line_of(node, ("quantize", "calibration", "file"))
    try:
        found = str(sha256_of(file.read_bytes()))
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the name
        reason = _one_line(getattr(exc, "strerror", None) or exc)
        raise RecipeError(
            path, f"cannot read {str(file)!r}: {reason}", field=field, line=line
        ) from exc
    if found != calibration.digest:
        raise RecipeError(
            path,
            f"{str(file)!r} has digest {found}, the recipe says {calibration.digest}",
            field="quantize.calibration.digest",
            line=_line_of(node, ("quantize", "calibration", "digest")),
        )
    return file


def _too_big(path: Path, size: int | None) -> None:
    seen = f"{size / 1024:.0f} KiB" if size is not None else "larger than that"
    raise RecipeError(path, f"the recipe is {seen}; the limit is {MAX_RECIPE_BYTES // 1024} KiB "
                      "(a recipe is a few KB: one model, a matrix and its settings)")


def load_recipe(path: Path) -> LoadedRecipe:
    try:
        with path.open("rb") as handle:  # never more than the limit: a FIFO or /dev/zero too
            raw = handle.read(MAX_RECIPE_BYTES + 1)
            if len(raw) > MAX_RECIPE_BYTES:
                size = path.stat().st_size if path.is_file() else None
                _too_big(path, size)
        text = raw.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")  # as read_text
    except FileNotFoundError as exc:
        raise RecipeError(path, "no such file") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise RecipeError(path, f"cannot read: {exc}") from exc
    return parse_recipe(path, text)
