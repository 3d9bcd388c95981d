"""Errors of the pipeline package.

    registry.errors.EnginectlError
    ├── RecipeError        the recipe file is unreadable or invalid (exit 2):
    │                      file, field path, YAML line and the bad value
    ├── PlanError          a target cannot be planned (exit 2): target id and the fix
    ├── StageError         a stage run failed (exit 3): stage, key, target and the log tail
    ├── SmokeError         an artifact failed its smoke run (exit 5): digest and failing check
    └── RuntimeMissingError  this machine has no program to serve an artifact with (exit 2):
                           the runtime and where it was looked for; never the artifact's fault

Each message is one line that says what failed, quotes the bad value and names the fix.
"""

from __future__ import annotations

from pathlib import Path

from registry.errors import EnginectlError


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
        super().__init__(f"{where}: {message}{log}" + (f"; last lines: {tail}" if tail else ""))


class SmokeError(EnginectlError):
    exit_code = 5

    def __init__(self, digest: str, failure: str) -> None:
        self.digest = digest
        self.failure = failure
        super().__init__(f"smoke failed, {digest} is quarantined: {failure}")


class RuntimeMissingError(EnginectlError):
    """No executable for *runtime* on this machine (a machine problem, not the artifact's)."""

    exit_code = 2

    def __init__(self, runtime: str, detail: str) -> None:
        self.runtime = runtime
        self.detail = detail
        super().__init__(f"cannot serve a {runtime} artifact on this machine: {detail}")
