"""The recipe's `matrix` section: the axes whose product is the targets, the shapes, and the
`exclude`/`include` entries (selections by axis)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field, field_validator, model_validator

from pipeline.recipe.fields import (
    MAX_AXIS,
    MAX_FILTERS,
    MAX_SHAPES,
    NAME,
    Count,
    GpuName,
    KvCacheDtype,
    Quant,
    Runtime,
    StrictModel,
    as_list,
    power_of_two,
    unique,
)


class Shape(StrictModel):
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
        if self.name is not None and not NAME.match(self.name):
            raise ValueError(f"shape name {self.name!r} is not a name")
        return self


_AXIS = Field(min_length=1, max_length=MAX_AXIS)
_SHAPES = Field(min_length=1, max_length=MAX_SHAPES)


class AxisSelection(StrictModel):
    """Targets picked by matrix axes: each axis a value or a list of values; an axis left
    out matches any value (`pipeline.planning.targets.selects`)."""

    gpu: Annotated[list[GpuName], BeforeValidator(as_list), _AXIS] | None = None
    tp: Annotated[list[Count], BeforeValidator(as_list), _AXIS] | None = None
    pp: Annotated[list[Count], BeforeValidator(as_list), _AXIS] | None = None
    quant: Annotated[list[Quant], BeforeValidator(as_list), _AXIS] | None = None
    kv_cache_dtype: Annotated[list[KvCacheDtype], BeforeValidator(as_list), _AXIS] | None = None
    shape: Annotated[list[str], BeforeValidator(as_list), _SHAPES] | None = None
    runtime: Annotated[list[Runtime], BeforeValidator(as_list), _AXIS] | None = None

    @field_validator("gpu", "tp", "pp", "quant", "kv_cache_dtype", "shape", "runtime")
    @classmethod
    def _no_repeats(cls, values: list[Any] | None) -> list[Any] | None:
        return None if values is None else unique(values)

    @field_validator("tp", "pp")
    @classmethod
    def _parallel(cls, values: list[int] | None) -> list[int] | None:
        return power_of_two(values)


class MatrixFilter(AxisSelection):
    """An `exclude` or `include` entry (at least one axis named)."""

    @model_validator(mode="after")
    def _not_empty(self) -> MatrixFilter:
        if all(getattr(self, name) is None for name in type(self).model_fields):
            raise ValueError("an empty entry matches everything; name at least one axis")
        return self


class Matrix(StrictModel):
    gpu: Annotated[list[GpuName], BeforeValidator(as_list), _AXIS]
    tp: Annotated[list[Count], BeforeValidator(as_list), _AXIS] = [1]  # noqa: RUF012 - pydantic copies defaults
    pp: Annotated[list[Count], BeforeValidator(as_list), _AXIS] = [1]  # noqa: RUF012 - pydantic copies defaults
    quant: Annotated[list[Quant], BeforeValidator(as_list), _AXIS] = ["bf16"]  # noqa: RUF012 - pydantic copies defaults
    kv_cache_dtype: Annotated[list[KvCacheDtype], BeforeValidator(as_list), _AXIS] = ["auto"]  # noqa: RUF012 - pydantic copies defaults
    shape: Annotated[list[Shape], BeforeValidator(as_list), _SHAPES]
    exclude: Annotated[list[MatrixFilter], Field(max_length=MAX_FILTERS)] = []  # noqa: RUF012 - pydantic copies defaults
    include: Annotated[list[MatrixFilter], Field(max_length=MAX_FILTERS)] = []  # noqa: RUF012 - pydantic copies defaults

    @field_validator("gpu", "tp", "pp", "quant", "kv_cache_dtype")
    @classmethod
    def _no_repeats(cls, values: list[Any]) -> list[Any]:
        return unique(values)

    @field_validator("tp", "pp")
    @classmethod
    def _parallel(cls, values: list[int]) -> list[int]:
        power_of_two(values)
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
