"""The one reader of recipes: `load_recipe` reads the file (at most MAX_RECIPE_BYTES) and
`parse_recipe` validates its text. It turns YAML syntax errors, duplicate keys and
`pydantic.ValidationError`s into a `RecipeError` naming the file, the field path, the YAML line
and the bad value, with a "did you mean" for misspelt keys.

Pure: nothing here reads beyond the recipe file itself. What the recipe's model source says
about itself (a local directory's config.json and content digest, the commit a branch points
at, a calibration file's digest) is read in planning (`pipeline.planning.source`).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipeline.errors import RecipeError
from pipeline.recipe.fields import MAX_RECIPE_BYTES, MAX_TARGETS
from pipeline.recipe.messages import explain, field_path, line_of, one_line, quote
from pipeline.recipe.schema import NightlySettings, Recipe
from registry.identity.canonical import floats_as_strings
from registry.identity.digest import sha256_of_json


class LoadedRecipe(BaseModel):
    """A validated recipe plus where it came from."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    path: Path
    text: str
    recipe: Recipe
    node: Any = Field(default=None, exclude=True, repr=False)  # the composed YAML, for lines

    @property
    def base_dir(self) -> Path:
        return self.path.parent

    def line_of(self, *loc: int | str) -> int | None:
        """The YAML line of the field at *loc*, e.g. `line_of("matrix", "exclude", 0)`."""
        node = self.node if self.node is not None else yaml.compose(self.text,
                                                                     Loader=yaml.SafeLoader)
        return line_of(node, loc)

    @property
    def digest(self) -> str:
        """Identity of what the recipe says, not how it is written (comments, key order)."""
        # a recipe without promotion channels (or nightly settings) keeps the digest it had
        # before they existed
        exclude = ({"promote"} if not self.recipe.promote else set()) | (
            {"nightly"} if self.recipe.nightly == NightlySettings() else set())
        return str(sha256_of_json(floats_as_strings(
            self.recipe.model_dump(mode="json", exclude=exclude))))



# libyaml's parser (PyYAML's C extension) composes ~3x faster, and skips comments ~50x
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
        problem = one_line(f"{context}{exc.problem}")
        raise RecipeError(path, f"YAML syntax error: {problem}", line=line) from exc
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow
        line = text.count("\n", 0, exc.position) + 1
        raise RecipeError(
            path, f"YAML error: character #x{exc.character:04x}: {exc.reason}", line=line
        ) from exc
    except yaml.YAMLError as exc:
        raise RecipeError(path, f"YAML error: {one_line(exc)}") from exc
    except RecursionError as exc:
        raise RecipeError(path, "YAML nested too deeply for a recipe") from exc
    except ValueError as exc:  # a scalar Python cannot hold, e.g. an int of 5000 digits
        raise RecipeError(path, f"YAML value error: {one_line(exc)}") from exc
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
                    f"duplicate key {quote(key)}",
                    field=field_path((*loc, key)),
                    line=key_node.start_mark.line + 1,
                )
            seen.add(key)
            _reject_duplicate_keys(path, value_node, (*loc, key), seen_nodes)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _reject_duplicate_keys(path, item, (*loc, index), seen_nodes)


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
        raise explain(path, node, exc) from exc
    targets = recipe.matrix.size(len(recipe.serve.runtimes))
    if targets > MAX_TARGETS:
        raise RecipeError(
            path, f"the matrix makes {targets} targets (its axes multiplied, times "
            f"{len(recipe.serve.runtimes)} runtimes, plus the includes); the limit is "
            f"{MAX_TARGETS}: split it into several recipes or narrow an axis",
            field="matrix", line=line_of(node, ("matrix",)),
        )
    if not recipe.model.is_local and recipe.model.architecture is None:
        raise RecipeError(
            path,
            f"{recipe.model.source!r} is not local, so declare the architecture "
            "(num_layers, hidden_size, ...) in the recipe",
            field="model.architecture",
            line=line_of(node, ("model",)),
        )
    return LoadedRecipe(path=path, text=text, recipe=recipe, node=node)


def expand_path(raw: str, base_dir: Path) -> Path:
    """*raw* with `~` expanded (where it names a home) and made relative to *base_dir*."""
    path = Path(raw)
    with contextlib.suppress(RuntimeError):  # `~nobody`: left as written, then not found
        path = path.expanduser()
    return path if path.is_absolute() else (base_dir / path)


def local_source_dir(recipe: Recipe, base_dir: Path) -> Path:
    return expand_path(recipe.model.source.removeprefix("file://"), base_dir)


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
