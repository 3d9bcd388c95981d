"""The README and docs/: every relative link resolves to a file, and a
`#fragment` to a heading of it (GitHub's slugs); every `enginectl …` command they show, in a
code block or in inline code, names a real command and real options of the click tree the
console script runs (walked here, never listed by hand); the README stays a ten-minute read.

What a command may hold besides: placeholders for positional arguments (`RECIPE`, `<recipe>`,
`…`), option values, `[--json]`-style optional parts (their options are checked too), variable
assignments before it (`VAR=1 enginectl …`), and a pipe or `;` after it (not checked further).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

from pipeline.cli import main

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
README_MAX_LINES = 250

FENCE = re.compile(r"^ {0,3}(```|~~~)(.*)$")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"(?<!`)(`+)(?!`)((?:(?!\n\s*\n).)+?)(?<!`)\1(?!`)", re.DOTALL)
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
SHELL_BLOCKS = {"", "sh", "bash", "shell", "console", "zsh", "text"}
COMMAND_END = {"|", "||", "&&", ";", "&", ">", ">>", "<", "2>", "2>&1"}
PLACEHOLDER_VALUE = re.compile(r"[A-Z]|[<>|…{]|\.\.\.")


@dataclass(frozen=True)
class Page:
    """A Markdown file split into its prose (code blocks blanked out) and its code blocks."""

    path: Path
    prose: str
    blocks: tuple[tuple[str, int, str], ...]  # (info string, first line number, text)

    @property
    def name(self) -> str:
        return str(self.path.relative_to(ROOT))


def read_page(path: Path) -> Page:
    prose: list[str] = []
    blocks: list[tuple[str, int, str]] = []
    fence: str | None = None
    info, start = "", 0
    body: list[str] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        opened = FENCE.match(line)
        if fence is None and opened:
            fence, info, start, body = opened.group(1), opened.group(2).strip(), number + 1, []
            prose.append("")
        elif fence is not None and line.strip().startswith(fence):
            blocks.append((info, start, "\n".join(body)))
            fence = None
            prose.append("")
        elif fence is not None:
            body.append(line)
            prose.append("")
        else:
            prose.append(line)
    assert fence is None, f"{path}: a code block opened at line {start - 1} is never closed"
    return Page(path, "\n".join(prose), tuple(blocks))


def without_inline_code(text: str) -> str:
    return INLINE_CODE.sub(lambda m: " " * len(m.group(0)), text)


# --- links -------------------------------------------------------------------------------


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text as rendered, lower case, punctuation other than
    `-` and `_` dropped, each space a `-` (github-slugger)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link counts by its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Page) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in page.prose.splitlines():
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(page: Page) -> Iterator[tuple[int, str]]:
    text = without_inline_code(page.prose)
    for match in LINK.finditer(text):
        yield text.count("\n", 0, match.start()) + 1, match.group(1)


def broken_links(page: Page) -> list[str]:
    problems = []
    for line, target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not ours to check
            continue
        file_part, _, fragment = target.partition("#")
        where = f"{page.name}:{line}: {target}"
        path = (page.path.parent / file_part).resolve() if file_part else page.path
        if not path.exists():
            problems.append(f"{where}: no such file {path.relative_to(ROOT)}")
            continue
        if not path.is_relative_to(ROOT):
            problems.append(f"{where}: outside the repository")
            continue
        if fragment:
            if path.suffix != ".md" or path.is_dir():
                problems.append(f"{where}: an anchor into a file that is not Markdown")
            elif fragment not in anchors(read_page(path) if file_part else page):
                problems.append(f"{where}: no heading #{fragment} in {path.relative_to(ROOT)}")
    return problems


# --- commands ----------------------------------------------------------------------------


def code_commands(page: Page) -> Iterator[tuple[int, str]]:
    """Shell lines of the page's code blocks (continuations joined, comments kept for shlex)."""
    for info, start, body in page.blocks:
        language = info.split()[0].lower() if info else ""
        if language not in SHELL_BLOCKS:
            continue
        pending, first = "", start
        for offset, line in enumerate(body.splitlines()):
            if not pending:
                first = start + offset
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            yield first, pending + line
            pending = ""
        if pending:
            yield first, pending


def inline_commands(page: Page) -> Iterator[tuple[int, str]]:
    for match in INLINE_CODE.finditer(page.prose):
        code = " ".join(match.group(2).split())
        if code.split(" ", 1)[0] == "enginectl":
            yield page.prose.count("\n", 0, match.start()) + 1, code


def tokens(line: str, *, comments: bool) -> list[str]:
    try:
        return shlex.split(line, comments=comments)
    except ValueError:  # an unclosed quote in prose: split on blanks
        return line.split()


def invocation(words: list[str]) -> list[str] | None:
    """The arguments after `enginectl` when the line runs it (after any VAR=value), else None."""
    for index, word in enumerate(words):
        if ASSIGNMENT.match(word):
            continue
        if word == "enginectl" or word.endswith("/bin/enginectl"):
            rest = words[index + 1:]
            end = next((i for i, w in enumerate(rest) if w in COMMAND_END), len(rest))
            return rest[:end]
        return None
    return None


def _options(command: click.Command, ctx: click.Context) -> dict[str, click.Parameter]:
    names: dict[str, click.Parameter] = {}
    for param in command.get_params(ctx):
        if isinstance(param, click.Option):
            for name in (*param.opts, *param.secondary_opts):
                names[name] = param
    return names


def check_command(args: list[str]) -> list[str]:
    """What is wrong with `enginectl ARGS` against the real click tree: [] when nothing."""
    command: click.Command = main
    ctx = click.Context(main, info_name="enginectl")
    path = "enginectl"
    problems: list[str] = []
    index = 0
    while index < len(args):
        word = args[index].strip("[]()")
        index += 1
        if word in {"", "…", "...", "|"}:
            continue
        if word.startswith("-") and word != "-":
            name, has_value, value = word.partition("=")
            options = _options(command, ctx)
            param = options.get(name)
            if param is None:
                problems.append(f"{path}: no option {name}")
                continue
            assert isinstance(param, click.Option)
            if param.is_flag or param.count:
                continue
            if not has_value:
                value = args[index].strip("[]()") if index < len(args) else ""
                index += max(param.nargs, 1)
            if (isinstance(param.type, click.Choice) and value
                    and not PLACEHOLDER_VALUE.search(value)
                    and value not in param.type.choices):
                problems.append(f"{path} {name}: {value!r} is none of {param.type.choices}")
            continue
        if isinstance(command, click.Group):
            sub = command.get_command(ctx, word)
            if sub is None:
                if PLACEHOLDER_VALUE.search(word):  # `enginectl COMMAND --help`: nothing to say
                    return problems
                problems.append(f"{path}: no command {word!r}")
                return problems
            command, path = sub, f"{path} {word}"
            ctx = click.Context(sub, parent=ctx, info_name=word)
        # else: a positional argument or a placeholder for one
    return problems


def commands(page: Page) -> Iterator[tuple[int, list[str]]]:
    for line, text in code_commands(page):
        args = invocation(tokens(text, comments=True))
        if args is not None:
            yield line, args
    for line, text in inline_commands(page):
        args = invocation(tokens(text, comments=False))
        if args is not None:
            yield line, args


# --- the tests ---------------------------------------------------------------------------


@pytest.mark.parametrize("path", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path: Path) -> None:
    assert broken_links(read_page(path)) == []


@pytest.mark.parametrize("path", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_enginectl_command_shown_is_real(path: Path) -> None:
    page = read_page(path)
    problems = [f"{page.name}:{line}: enginectl {' '.join(args)}: {problem}"
                for line, args in commands(page) for problem in check_command(args)]
    assert problems == []


def test_the_checks_see_what_the_pages_hold() -> None:
    """Not vacuous: the pages show many commands and links, and reach every top command."""
    pages = [read_page(path) for path in PAGES]
    shown = [args for page in pages for _, args in commands(page)]
    assert len(shown) > 80
    assert sum(1 for page in pages for _ in links(page)) > 30
    named = {args[0] for args in shown if args}
    assert set(main.commands) <= named, set(main.commands) - named


OWN_ISSUE = re.compile(r"\bissues?\s+#?\d+", re.IGNORECASE)
UPSTREAM = ("torch-tensorrt", "tensorrt-llm", "tensorrt", "vllm", "ray", "litellm", "kuberay",
            "modelopt", "transformers", "pytorch", "github.com")
STANDALONE_PAGES = [*PAGES, ROOT / "bench" / "README.md"]


def outside_references(name: str, text: str) -> list[str]:
    """What on one page points at `../shared` or names one of our own issues: a reader of the
    checkout has neither the folder beside it nor the tracker (links that leave the repository
    are `broken_links`'s to catch). An upstream project's issue, named just before it, is a
    public reference and may stay."""
    problems = []
    for number, line in enumerate(text.splitlines(), 1):
        if "../shared" in line:
            problems.append(f"{name}:{number}: points at ../shared, outside the repository")
        for match in OWN_ISSUE.finditer(line):
            before = line[max(0, match.start() - 40):match.start()].lower()
            if not any(upstream in before for upstream in UPSTREAM):
                problems.append(f"{name}:{number}: names an issue ({match.group(0)!r})")
    return problems


@pytest.mark.parametrize("path", STANDALONE_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_page_stands_on_its_own(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert outside_references(str(path.relative_to(ROOT)), text) == []


def test_a_page_pointing_outside_is_caught() -> None:
    text = ("See `../shared/DESIGN.md`; as issue 24 said (issues #7).\n"
            "Torch-TensorRT issue 3255 saw zeros.\n")
    problems = outside_references("docs/x.md", text)
    assert problems == ["docs/x.md:1: points at ../shared, outside the repository",
                        "docs/x.md:1: names an issue ('issue 24')",
                        "docs/x.md:1: names an issue ('issues #7')"], problems


def test_the_readme_is_a_ten_minute_read() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines < README_MAX_LINES, f"README.md has {lines} lines; move detail to docs/"


def test_a_broken_link_is_caught() -> None:
    page = Page(ROOT / "docs" / "keys.md", "# Here\n\n[a](nowhere.md), [b](keys.md#no-such),\n"
                "[c](commands/build.md#build), [d](#here), [e](https://example.org/x) `[f](no.md)`",
                ())
    problems = broken_links(page)
    assert len(problems) == 2, problems
    assert "docs/keys.md:3: nowhere.md: no such file docs/nowhere.md" in problems
    assert "docs/keys.md:3: keys.md#no-such: no heading #no-such in docs/keys.md" in problems


@pytest.mark.parametrize(("line", "wrong"), [
    ("enginectl biuld recipes/x.yaml", "no command 'biuld'"),
    ("enginectl build recipes/x.yaml --jbos 4", "no option --jbos"),
    ("enginectl db upgrad", "no command 'upgrad'"),
    ("enginectl fsck [--repiar]", "no option --repiar"),
    ("enginectl build RECIPE --executor slurm", "'slurm' is none of"),
    ("HF_HUB_OFFLINE=1 enginectl pull --model m --gpux auto -o /m | head", "no option --gpux"),
])
def test_a_wrong_command_is_caught(line: str, wrong: str) -> None:
    args = invocation(tokens(line, comments=True))
    assert args is not None
    assert any(wrong in problem for problem in check_command(args)), check_command(args)


def test_commands_are_found_in_prose_and_in_shell_blocks_only() -> None:
    page = Page(ROOT / "docs" / "probe.md", "Run `enginectl build\nRECIPE --jbos 4` now; not\n\n"
                "`this` or `enginectl: error: no`.", (("sh", 5, "enginectl biuld \\\n  x"),
                                                       ("json", 9, "enginectl nope"),
                                                       ("", 12, "$(enginectl x) # enginectl y")))
    found = sorted((line, check_command(args)) for line, args in commands(page))
    assert found == [(1, ["enginectl build: no option --jbos"]),
                     (5, ["enginectl: no command 'biuld'"])]


@pytest.mark.parametrize("line", [
    "enginectl plan <recipe> --commands | head -n 3",
    "enginectl rollback ALIAS [--note …] [--json]",
    "enginectl -q build RECIPE --only 'H100*/tp8/*/fp8/*' --jobs=4  # comment --nope",
    "ENGINECTL_EXECUTOR=ray enginectl plan recipes/x.yaml --executor ray",
    "enginectl db upgrade | db current",
    "enginectl pull --model M --gpu auto -o DIR --verify strict --prefer KIND",
    "enginectl COMMAND --help",
])
def test_placeholders_pipes_and_prefixes_pass(line: str) -> None:
    args = invocation(tokens(line, comments=True))
    assert args is not None
    assert check_command(args) == []


@pytest.mark.parametrize(("heading", "anchor"), [
    ("Store layout", "store-layout"),
    ("`enginectl plan --json`", "enginectl-plan---json"),
    ("What runs where: which probe says what", "what-runs-where-which-probe-says-what"),
    ("Fleet (Ray): `build --executor ray`, `fleet`", "fleet-ray-build---executor-ray-fleet"),
])
def test_slugs_follow_github(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor
