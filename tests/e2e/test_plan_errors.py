"""`enginectl plan` run as a user runs it: a bad recipe is one line on stderr and exit 2.

Each file in tests/data/bad_recipes/ carries its expectation in leading comments:

    # expect: <fragment>     one or more; each must appear in the message
    # field: <field path>    the field the message names, right after the location
    # target: <target id>    for plan errors: the target the message names instead
    # line: <n>              the YAML line, where the reader can tell it

so the message must start `enginectl: error: <path>[:<line>]: [<field>: | target <id>: ]`.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.cli import GOOD_RECIPE, PREFIX, assert_one_line_error, enginectl

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "data" / "bad_recipes"
BAD_RECIPES = sorted(CORPUS.glob("*.yaml"))
_HEADER = re.compile(r"# (expect|field|target|line): (.+?)\s*$")


@dataclass(frozen=True)
class Expectation:
    fragments: list[str]
    field: str | None
    target: str | None
    line: int | None

    def prefix(self, path: Path) -> str:
        location = f"{path}:{self.line}" if self.line is not None else str(path)
        if self.field is not None:
            return f"{PREFIX}{location}: {self.field}: "
        if self.target is not None:
            return f"{PREFIX}{location}: target {self.target}: "
        return f"{PREFIX}{location}: "


def read_expectation(path: Path) -> Expectation:
    found: dict[str, list[str]] = {}
    for text in path.read_text(encoding="utf-8").splitlines():
        match = _HEADER.fullmatch(text)
        if match:
            found.setdefault(match[1], []).append(match[2])
    for name in ("field", "target", "line"):
        assert len(found.get(name, [])) <= 1, f"{path.name}: more than one '# {name}:'"
    line = found.get("line", [None])[0]
    return Expectation(
        fragments=found.get("expect", []),
        field=found.get("field", [None])[0],
        target=found.get("target", [None])[0],
        line=None if line is None else int(line),
    )


def test_the_corpus_is_large_and_annotated() -> None:
    assert len(BAD_RECIPES) >= 20
    for path in BAD_RECIPES:
        expectation = read_expectation(path)
        assert expectation.fragments, f"{path.name} has no '# expect:' line"
        assert not (expectation.field and expectation.target), path.name


@pytest.mark.parametrize("path", BAD_RECIPES, ids=[p.stem for p in BAD_RECIPES])
def test_bad_recipe_is_one_line_and_exit_2(path: Path, tmp_path: Path) -> None:
    expectation = read_expectation(path)
    relative = path.relative_to(ROOT)
    message = assert_one_line_error(enginectl(tmp_path, "plan", str(relative)))
    assert message.startswith(expectation.prefix(relative)), message
    for fragment in expectation.fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-recipe.yaml"
    message = assert_one_line_error(enginectl(tmp_path, "plan", str(missing)))
    assert message == f"{PREFIX}{missing}: no such file"


def test_zero_byte_file(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_bytes(b"")
    message = assert_one_line_error(enginectl(tmp_path, "plan", str(empty)))
    assert message == f"{PREFIX}{empty}: the recipe is empty"


def test_not_utf8(tmp_path: Path) -> None:
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes("name: caf\xe9\n".encode("latin-1"))
    message = assert_one_line_error(enginectl(tmp_path, "plan", str(latin1)))
    assert message.startswith(f"{PREFIX}{latin1}: cannot read: ")


def test_control_character_names_its_line(tmp_path: Path) -> None:
    recipe = tmp_path / "bell.yaml"
    recipe.write_text("name: x\nmodel: \x07\n", encoding="utf-8")
    message = assert_one_line_error(enginectl(tmp_path, "plan", str(recipe)))
    assert message.startswith(f"{PREFIX}{recipe}:2: YAML error: character #x0007")


# ---- the good recipe ------------------------------------------------------------------------


def test_plan_of_the_good_recipe_exits_0(tmp_path: Path) -> None:
    result = enginectl(tmp_path, "plan", str(GOOD_RECIPE))
    assert result.returncode == 0, result.stderr
    # a fresh home has no recorded toolchain: one note says which versions the keys use
    assert result.stderr.startswith("enginectl: note: no toolchain is recorded")
    assert "builder image's versions" in result.stderr
    assert len(result.stderr.splitlines()) == 1
    assert "H100-SXM5-80GB/tp8/pp1/fp8/kv-fp8/chat/trtllm" in result.stdout


def test_plan_json(tmp_path: Path) -> None:
    result = enginectl(tmp_path, "plan", "--json", str(GOOD_RECIPE))
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert {"recipe", "targets", "stages"} <= plan.keys()
    assert plan["targets"]
    assert plan["stages"]
    for stage in plan["stages"]:
        assert {"stage", "key", "inputs", "params", "argv", "targets"} <= stage.keys(), stage
        assert stage["targets"], stage["key"]


def _value(argv: list[str], flag: str) -> str:
    assert argv.count(flag) == 1, f"{flag} in {argv}"
    return argv[argv.index(flag) + 1]


def test_plan_commands(tmp_path: Path) -> None:
    commands = enginectl(tmp_path, "plan", "--commands", str(GOOD_RECIPE))
    assert commands.returncode == 0, commands.stderr
    lines = commands.stdout.splitlines()
    argvs = [shlex.split(line) for line in lines]
    assert [shlex.join(argv) for argv in argvs] == lines  # each line is exactly one argv

    as_json = json.loads(enginectl(tmp_path, "plan", "--json", str(GOOD_RECIPE)).stdout)
    shown = [argv for s in as_json["stages"]  # a stripped engine's refit runs before its smoke
             for argv in [*s.get("before", []), *([s["argv"]] if s["argv"] is not None else [])]]
    assert argvs == shown
    refit = next(line for line in lines if line.startswith("trtllm-refit "))  # strip_plan: true
    assert {"--engine_dir", "--checkpoint_dir", "--output_dir"} <= set(shlex.split(refit))

    build = next(line for line in lines if line.startswith("trtllm-build "))
    assert build.startswith("trtllm-build --checkpoint_dir ")
    assert "--max_batch_size 128 --max_input_len 2048 --max_seq_len 4096" in build

    vllm_line = next(line for line in lines if " vllm.entrypoints.cli.main serve " in line)
    vllm = shlex.split(vllm_line)
    assert _value(vllm, "--tensor-parallel-size") == "8"
    assert _value(vllm, "--quantization") == "fp8"
    assert _value(vllm, "--max-model-len") == "4096"
    assert _value(vllm, "--dtype") == "bfloat16"
    assert "--dtype fp8" not in vllm_line
