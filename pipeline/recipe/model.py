"""The recipe's `model` section: where the checkpoint comes from and what its architecture is
(what the memory math needs)."""

from __future__ import annotations

import re

from pydantic import Field, ValidationInfo, field_validator, model_validator

from pipeline.recipe.fields import COMMIT, NAME, Count, ModelDtype, StrictModel


class Architecture(StrictModel):
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


class ModelSpec(StrictModel):
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
        if not NAME.match(value):
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
            if not COMMIT.match(revision) and not info.data.get("resolve_revision"):
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

