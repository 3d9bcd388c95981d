"""What a recipe's model source says about itself, read where planning starts: the
architecture from a local directory's config.json (checked against what the recipe declares),
the content digest of that directory, the commit an `hf://` branch or tag points at
(`resolve_revision`), and the calibration file, digest-checked. The recipe reader validates
without reading any of it (`pipeline.recipe.reader`); this is the I/O planning does.

Cached per process: a directory's digest while none of its files changed (path, size, mtime,
ctime and inode of every entry; a tree touched in the last seconds is hashed again, as git
does with racy entries), a calibration file's the same way, and a branch's commit once per
(repo, branch): one process keys every stage with the same commit.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import ValidationError

from pipeline.errors import RecipeError
from pipeline.planning.file_stats import RACY_S, file_signature, tree_signature
from pipeline.recipe.fields import COMMIT
from pipeline.recipe.messages import field_path, line_of, one_line, quote
from pipeline.recipe.model import Architecture
from pipeline.recipe.reader import LoadedRecipe, expand_path, load_recipe, local_source_dir
from pipeline.recipe.schema import Calibration, Recipe
from pipeline.stages.hub import HubError, resolve_commit
from registry.identity.digest import sha256_of, tree_digest


@dataclass(frozen=True, slots=True)
class ModelSource:
    """What planning keys the snapshot with and sizes targets by."""

    architecture: Architecture
    digest: str | None  # content of a local source directory
    revision: str | None  # the commit an hf:// source is pinned or resolved to
    calibration_file: Path | None  # the calibration file, resolved and digest-checked


def model_source(loaded: LoadedRecipe) -> ModelSource:
    """Read what *loaded*'s source says (cached, see the module doc); RecipeError naming the
    recipe field when it cannot be read or contradicts the recipe."""
    path, recipe, node = loaded.path, loaded.recipe, loaded.node
    architecture = _architecture(path, recipe, node)
    digest = None
    if recipe.model.is_local:
        try:
            digest = _cached(local_source_dir(recipe, path.parent), tree_signature,
                             lambda root: str(tree_digest(root)))
        except (OSError, ValueError) as exc:
            raise RecipeError(
                path,
                f"cannot read the local model: {one_line(exc)}",
                field="model.source",
                line=line_of(node, ("model", "source")),
            ) from exc
    return ModelSource(
        architecture=architecture,
        digest=digest,
        revision=_revision(path, recipe, line_of(node, ("model", "revision"))),
        calibration_file=_calibration_file(path, recipe.quantize.calibration, node),
    )


_lock = threading.Lock()
_digests: dict[Path, tuple[object, str]] = {}
_commits: dict[tuple[str, str], str | None] = {}


def _cached(root: Path, signature: Callable[[Path], tuple[object, float]],
            compute: Callable[[Path], str]) -> str:
    """*compute*(root), reused while *signature*(root) is unchanged and not racy."""
    try:
        seen, newest = signature(root)
    except (OSError, ValueError):  # let compute say what is wrong, in its own words
        return compute(root)
    with _lock:
        hit = _digests.get(root)
    if hit is not None and hit[0] == seen:
        return hit[1]
    started = time.time()
    found = compute(root)
    if newest < started - RACY_S:
        with _lock:
            _digests[root] = (seen, found)
    return found


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


def _architecture(path: Path, recipe: Recipe, node: yaml.Node | None) -> Architecture:
    declared = recipe.model.architecture
    if not recipe.model.is_local:
        assert declared is not None  # noqa: S101 - the reader refuses a remote source without one
        return declared
    model_dir = local_source_dir(recipe, path.parent)
    line = line_of(node, ("model", "source"))
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
            f"{str(config)!r}: {field_path(tuple(first['loc']))}: {one_line(first['msg'])} "
            f"(got {quote(first.get('input'))})",
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
            f"cannot read {str(config)!r}: {one_line(exc)}",
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
            line=line_of(node, ("model", "architecture")),
        )
    return found


def _revision(path: Path, recipe: Recipe, line: int | None) -> str | None:
    """The commit to build from: the pinned one, or, with resolve_revision, what the
    branch or tag points at now (asked of the hub; recorded in the snapshot key)."""
    model = recipe.model
    if not model.source.startswith("hf://") or model.revision is None:
        return model.revision
    if COMMIT.match(model.revision):
        return model.revision
    repo = model.source.removeprefix("hf://")
    key = (repo, model.revision)
    with _lock:
        known = key in _commits
        sha = _commits.get(key)
    if not known:
        try:
            sha = resolve_commit(repo, model.revision)
        except HubError as exc:
            raise RecipeError(
                path, f"cannot resolve {model.revision!r} of {repo} to a commit: "
                f"{exc.first_line}; pin the commit instead", field="model.revision", line=line,
            ) from exc
        with _lock:
            _commits[key] = sha
    if not sha or not COMMIT.match(sha):
        raise RecipeError(path, f"the hub gave no commit for {model.revision!r} of {repo}",
                          field="model.revision", line=line)
    return sha


def _calibration_file(
    path: Path, calibration: Calibration, node: yaml.Node | None
) -> Path | None:
    if calibration.file is None:
        return None
    file = expand_path(calibration.file, path.parent)
    field = "quantize.calibration.file"
    line = line_of(node, ("quantize", "calibration", "file"))
    try:
        found = _cached(file, file_signature, lambda f: str(sha256_of(f.read_bytes())))
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the name
        reason = one_line(getattr(exc, "strerror", None) or exc)
        raise RecipeError(
            path, f"cannot read {str(file)!r}: {reason}", field=field, line=line
        ) from exc
    if found != calibration.digest:
        raise RecipeError(
            path,
            f"{str(file)!r} has digest {found}, the recipe says {calibration.digest}",
            field="quantize.calibration.digest",
            line=line_of(node, ("quantize", "calibration", "digest")),
        )
    return file




def with_source_read(loaded: LoadedRecipe) -> LoadedRecipe:
    """*loaded*, once its model source reads (`model_source`, cached for the plan that
    follows): for a caller that reports an unreadable source where it reads the recipe."""
    model_source(loaded)
    return loaded


def read_recipe(path: Path) -> LoadedRecipe:
    """`load_recipe`, then `with_source_read`: what a command that plans reads its RECIPE with."""
    return with_source_read(load_recipe(path))
