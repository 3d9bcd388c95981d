"""Errors of the pipeline package.

    registry.errors.EnginectlError
    ├── RecipeError        the recipe file is unreadable or invalid (exit 2):
    │                      file, field path, YAML line and the bad value
    └── PlanError          a target cannot be planned (exit 2): target id and the fix

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
