"""Whatever a recipe file holds, reading and planning it ends in a plan or in one enginectl
error with a one-line message: never another exception, never a traceback.

Three sources of input: random YAML documents (recursive dicts, lists and scalars over the
recipe's own vocabulary, dumped with `yaml.safe_dump`), raw random text, and one to three
random mutations (delete, replace, retype, rename, duplicate) of a valid recipe.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from pipeline.errors import PlanError, RecipeError
from pipeline.planning.plan import plan_recipe
from pipeline.recipe import fields, matrix, model, schema
from pipeline.recipe.reader import parse_recipe
from pipeline.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
BASE: dict[str, Any] = yaml.safe_load(
    (ROOT / "recipes" / "llama70b-h100.yaml").read_text(encoding="utf-8")
)
FUZZ_PATH = Path("fuzz.yaml")
SETTINGS = Settings.from_env({"ENGINECTL_HOME": "/nonexistent/enginectl-fuzz"})
FUZZ = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# Every key any recipe model knows, so random documents get past the top level sometimes.
KNOWN_KEYS = sorted(
    {
        field.alias or name
        for module in (matrix, model, schema)
        for cls in vars(module).values()
        if isinstance(cls, type) and issubclass(cls, BaseModel)
        for name, field in cls.model_fields.items()
    }
)
WORDS = [
    "h100", "a100", "b200", "l4", "cpu", "H100-SXM5-80GB", "bf16", "fp16", "fp8", "int4_awq",
    "int8_sq", "w4a8_awq", "nvfp4", "auto", "int8", "trtllm", "trtllm-pytorch", "vllm",
    "bfloat16", "float16", "enable", "disable", "chat", "long", "hf://org/repo", "s3://bucket/x",
    "6f6073b423013f6a7d4d9f39144961bfbfbc386b", "main", "sha256:" + "0" * 64, "", "~", ".",
]

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from([0, 1, 2, 3, 4, 8, 16, 64, 128, 4096, -1, 2**31, 2**64])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from(WORDS)
    | st.text(max_size=12)
)
keys = st.sampled_from(KNOWN_KEYS) | st.text(max_size=10) | st.integers() | st.none()
documents = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=6),
    max_leaves=40,
)
yaml_ish_text = st.text(alphabet=" \n\t:-,[]{}#&*!|>'\"%@`?~.0123456789abcdefhmx\\", max_size=200)


def plan_or_fail_cleanly(text: str) -> None:
    """Read and plan *text*; an error must be ours and read as one line about this file."""
    try:
        plan = plan_recipe(parse_recipe(FUZZ_PATH, text), SETTINGS)
        plan.as_dict()  # what `plan --json` and `plan --commands` print
        plan.commands()
        event("planned")
    except (RecipeError, PlanError) as exc:
        event(type(exc).__name__)
        message = str(exc)
        assert len(message.splitlines()) == 1, message
        assert message.startswith(f"{FUZZ_PATH}"), message


def test_the_base_recipe_plans() -> None:
    plan_recipe(parse_recipe(FUZZ_PATH, yaml.safe_dump(BASE, sort_keys=False)), SETTINGS)


@FUZZ
@given(documents)
def test_random_yaml_documents(document: Any) -> None:
    plan_or_fail_cleanly(yaml.safe_dump(document, allow_unicode=True))


@FUZZ
@given(st.text(max_size=300) | yaml_ish_text)
def test_random_text(text: str) -> None:
    plan_or_fail_cleanly(text)


@FUZZ
@given(st.dictionaries(st.sampled_from(KNOWN_KEYS), documents, max_size=8))
def test_random_mappings_of_known_keys(document: dict[str, Any]) -> None:
    plan_or_fail_cleanly(yaml.safe_dump(document, allow_unicode=True))


# ---- mutations of a valid recipe ------------------------------------------------------------


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every (key or index) path into *value*'s dicts and lists."""
    if isinstance(value, dict):
        items: list[tuple[Any, Any]] = list(value.items())
    elif isinstance(value, list):
        items = list(enumerate(value))
    else:
        return []
    found = []
    for key, item in items:
        found.append((*prefix, key))
        found.extend(_paths(item, (*prefix, key)))
    return found


def _at(data: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        data = data[part]
    return data


def _retypings(value: Any) -> list[Any]:
    """The same content in other YAML types: 8 → "8", 8.0, [8]; [a] → a, {0: a}; ..."""
    if isinstance(value, bool):
        options = [str(value).lower(), int(value), [value]]
    elif isinstance(value, int):
        options = [str(value), float(value), [value], -value, {"value": value}]
    elif isinstance(value, float):
        options = [str(value), int(value), [value]]
    elif isinstance(value, str):
        options = [[value], {value: value}, len(value), value.upper(), value + " ", None]
    elif isinstance(value, list):
        options = [value[0] if value else None, dict(enumerate(value)), str(value), [value]]
    elif isinstance(value, dict):
        options = [list(value), list(value.values()), None, str(value), [value]]
    else:
        options = [str(value), [value]]
    return options


@st.composite
def mutated_recipes(draw: st.DrawFn) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        path = draw(st.sampled_from(_paths(data)))
        parent, key = _at(data, path[:-1]), path[-1]
        operation = draw(st.sampled_from(["delete", "replace", "retype", "rename", "duplicate"]))
        if operation == "delete":
            del parent[key]
        elif operation == "replace":
            parent[key] = draw(documents)
        elif operation == "retype":
            parent[key] = draw(st.sampled_from(_retypings(parent[key])))
        elif isinstance(parent, dict) and operation == "rename":
            name = str(key)  # a replaced subtree may have keys of any type
            typo = draw(
                st.sampled_from([name[:-1], name + "s", name.upper(), name.replace("_", "-")])
                | st.sampled_from(KNOWN_KEYS)
                | st.text(min_size=1, max_size=10)
            )
            parent[typo] = parent.pop(key)
        elif isinstance(parent, list):  # duplicate an axis value, a shape, an exclude entry
            parent.insert(key, copy.deepcopy(parent[key]))
        if not data:
            break
    return data


@FUZZ
@given(mutated_recipes())
def test_mutated_recipes(data: dict[str, Any]) -> None:
    plan_or_fail_cleanly(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))


# ---- random matrices over valid values: reaches the plan checks and the memory math ---------

GPUS = ["h100", "a100", "a100-40gb", "l4", "l40s", "a10g", "h200", "b200", "gh200", "cpu"]
QUANTS = list(fields.QUANTS)
KV_DTYPES = ["auto", "fp8", "int8"]
RUNTIMES = list(fields.RUNTIMES)


def _axis(values: list[Any]) -> st.SearchStrategy[list[Any]]:
    return st.lists(st.sampled_from(values), min_size=1, max_size=3, unique=True)


sizes = st.integers(min_value=1, max_value=1 << 17) | st.sampled_from([1, 128, 4096, 131072])
shapes = st.builds(
    lambda batch, seq, prompt, tokens: {
        "max_batch_size": batch,
        "max_input_len": min(prompt, seq),
        "max_seq_len": seq,
        **({} if tokens is None else {"max_num_tokens": min(tokens, batch * seq)}),
    },
    sizes,
    sizes,
    sizes,
    st.none() | sizes,
)
filters = st.fixed_dictionaries(
    {},
    optional={
        "gpu": _axis(GPUS),
        "tp": _axis([1, 2, 4, 8, 16]),
        "quant": _axis(QUANTS),
        "kv_cache_dtype": _axis(KV_DTYPES),
        "runtime": _axis(RUNTIMES),
    },
)
matrices = st.fixed_dictionaries(
    {
        "gpu": _axis(GPUS),
        "tp": _axis([1, 2, 4, 8, 16, 32]),
        "pp": _axis([1, 2, 4]),
        "quant": _axis(QUANTS),
        "kv_cache_dtype": _axis(KV_DTYPES),
        "shape": st.lists(shapes, min_size=1, max_size=2),
    },
    optional={"exclude": st.lists(filters, max_size=2), "include": st.lists(filters, max_size=2)},
)
serves = st.lists(st.sampled_from(RUNTIMES), min_size=1, max_size=3, unique=True).map(
    lambda runtimes: {runtime: {} for runtime in runtimes}
)


@FUZZ
@given(matrices, serves)
def test_random_matrices(matrix: dict[str, Any], serve: dict[str, Any]) -> None:
    data = {**copy.deepcopy(BASE), "matrix": matrix, "serve": serve}
    plan_or_fail_cleanly(yaml.safe_dump(data, sort_keys=False))
