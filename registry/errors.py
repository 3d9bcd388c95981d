"""Errors of the registry package, and the root of every enginectl error.

    EnginectlError                 root; carries the CLI exit code
    ├── UsageError                 bad command-line input (exit 2)
    └── RegistryError              registry, store or integrity problem (exit 4)

`pipeline.errors` hangs its own errors (recipe, plan, stage, smoke) under the same root.
Only the CLI catches them; everything else raises with `raise ... from exc`.
"""

from __future__ import annotations


class EnginectlError(Exception):
    """Base of every error the CLI turns into a one-line message and an exit code."""

    exit_code: int = 1


class UsageError(EnginectlError):
    exit_code = 2


class RegistryError(EnginectlError):
    exit_code = 4
