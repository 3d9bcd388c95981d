"""Errors of the pipeline package.

    registry.errors.EnginectlError
    ├── RecipeError        the recipe file is unreadable or invalid (exit 2):
    │                      file, field path, YAML line and the bad value
    ├── PlanError          a target cannot be planned (exit 2): target id and the fix
    ├── StageError         a stage run failed (exit 3): stage, key, target and the log tail
    ├── MachineError       this machine cannot run it (exit 3): no GPU of the SKU, a runtime
    │                      or program missing; nothing about the artifact changes
    ├── SmokeError         an artifact failed its smoke run (exit 5): digest and failing check
    ├── FleetError         the Ray cluster cannot run the plan (exit 2): unreachable, a GPU
    │                      SKU no node has, a pool whose nodes disagree; names the pools
    ├── NothingProvenError  `advise`/`route`: the model has no artifact proven with a capacity
    │                      curve on its pool's current fingerprint (exit 6): model, reasons
    ├── BuildCancelledError  Ctrl-C stopped a build (exit 130): what was kept, how to resume
    ├── RuntimeMissingError  this machine has no program to serve an artifact with (exit 2,
    │                      `pull`/`serve`): the runtime and where it was looked for; never the
    │                      artifact's fault
    registry.errors.UsageError
    └── NoNvidiaSmiError   `--gpu auto` on a machine without nvidia-smi (exit 2): pass --gpu
                           SKU, or --gpu cpu where the model has an entry proven on the CPU

Each message is one line that says what failed, quotes the bad value and names the fix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from registry.errors import EnginectlError, UsageError


class RecipeError(EnginectlError):
    exit_code = 2

    def __init__(
        self,
        path: Path | str,
        message: str,
        *,
        field: str | None = None,
        line: int | None = None,
    ) -> None:
        self.path = str(path)
        self.field = field
        self.line = line
        self.message = message
        where = self.path if line is None else f"{self.path}:{line}"
        text = f"{where}: {field}: {message}" if field else f"{where}: {message}"
        super().__init__(text)


class PlanError(EnginectlError):
    exit_code = 2

    def __init__(self, path: Path | str, target: str, message: str, fix: str) -> None:
        self.path = str(path)
        self.target = target
        self.fix = fix
        super().__init__(f"{self.path}: target {target}: {message}; {fix}")


class StageError(EnginectlError):
    exit_code = 3

    def __init__(
        self,
        stage: str,
        key: str,
        message: str,
        *,
        target: str | None = None,
        log_path: Path | None = None,
        log_tail: str = "",
    ) -> None:
        self.stage = stage
        self.key = key
        self.target = target
        self.log_path = log_path
        self.log_tail = log_tail
        where = f"{stage} {key.removeprefix('k1:')[:12]}" + (f" ({target})" if target else "")
        tail = " | ".join(line.strip() for line in log_tail.splitlines()[-3:] if line.strip())
        log = f"; log {log_path}" if log_path else ""
        if message.startswith(f"{where}: "):  # a run's own message, raised again by the CLI
            super().__init__(message)
            return
        super().__init__(f"{where}: {message}{log}" + (f"; last lines: {tail}" if tail else ""))


class SmokeError(EnginectlError):
    exit_code = 5

    def __init__(self, digest: str, failure: str) -> None:
        self.digest = digest
        self.failure = failure
        super().__init__(f"smoke failed, {digest} is quarantined: {failure}")


class FleetError(EnginectlError):
    """The cluster, not the recipe or an artifact, is what is wrong: nothing was submitted."""

    exit_code = 2

    def __init__(self, message: str, *, address: str | None = None,
                 pools: tuple[str, ...] = ()) -> None:
        self.address = address
        self.pools = pools
        super().__init__(message)


class MachineError(EnginectlError):
    """An error of this machine, never of the artifact: its status stays as it was."""

    exit_code = 3

    def __init__(self, what: str, reason: str, fix: str) -> None:
        self.what = what
        self.reason = reason
        self.fix = fix
        super().__init__(f"{what}: {reason}; {fix}")


class BuildCancelledError(EnginectlError):
    """Ctrl-C stopped a build; *kept* stages are published, *cancelled* ones left nothing."""

    exit_code = 130

    def __init__(self, recipe: Path | str, kept: int, cancelled: list[str], *,
                 summary: Any = None) -> None:
        self.recipe = str(recipe)
        self.kept = kept
        self.cancelled = cancelled
        self.summary = summary  # the build's BuildSummary, for `--json`
        stopped = f"cancelled {', '.join(cancelled)} (partial output removed); " \
            if cancelled else ""
        super().__init__(
            f"interrupted: {stopped}kept {kept} finished stage"
            f"{'' if kept == 1 else 's'} (published); "
            f"rerun `enginectl build {self.recipe}` to resume from them"
        )


class RuntimeMissingError(EnginectlError):
    """No executable for *runtime* on this machine (a machine problem, not the artifact's)."""

    exit_code = 2

    def __init__(self, runtime: str, detail: str) -> None:
        self.runtime = runtime
        self.detail = detail
        super().__init__(f"cannot serve a {runtime} artifact on this machine: {detail}")


class NoNvidiaSmiError(UsageError):
    """`--gpu auto` on a machine without nvidia-smi: nothing says what GPU it has."""

    def __init__(self, hint: str = "pass --gpu SKU (e.g. --gpu h100)") -> None:
        self.hint = hint
        super().__init__(f"--gpu auto reads nvidia-smi, which is not on this machine; {hint}")


class NothingProvenError(EnginectlError):
    """No artifact of *model* has a passing proof with a capacity curve on its pool's
    current fingerprint (exit 6: the registry answered, and has nothing to advise from);
    *reasons*: one line per artifact left out."""

    exit_code = 6

    def __init__(self, model: str, reasons: list[str]) -> None:
        self.model = model
        self.reasons = reasons
        lines = [(f"nothing proven to advise {model} from: {len(reasons)} artifacts left "
                  "out; set smoke.capacity in the recipe and build (or `enginectl smoke REF`)")]
        lines += [f"  {reason}" for reason in reasons]
        super().__init__("\n".join(lines))
