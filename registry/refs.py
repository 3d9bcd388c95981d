"""Refs: what users type for an artifact — a full digest, a unique prefix of at least 12 hex
digits (with or without `sha256:`), or an alias name."""

from __future__ import annotations

import re
from typing import Final

from sqlalchemy.orm import Session

from registry import records
from registry.errors import RecordNotFoundError, UsageError

MIN_PREFIX: Final = 12
_HEX: Final = re.compile(r"^(sha256:)?[0-9a-f]+$")
ALIAS_NAME: Final = re.compile(r"^[a-z0-9][a-z0-9._/-]{0,199}$")


def check_alias_name(name: str) -> str:
    if not ALIAS_NAME.match(name) or _HEX.match(name) or "//" in name or name.endswith("/"):
        raise UsageError(
            f"alias {name!r} is not a valid name: lowercase letters, digits, '.', '_', '-', '/', "
            "and not all hex digits (that would read as a digest prefix)"
        )
    return name


def resolve_ref(session: Session, ref: str) -> str:
    """The full digest *ref* names, or RecordNotFoundError / UsageError."""
    if _HEX.match(ref):
        hex_part = ref.removeprefix("sha256:")
        if len(hex_part) < MIN_PREFIX:
            raise UsageError(
                f"digest prefix {ref!r} is too short: give at least {MIN_PREFIX} hex digits"
            )
        matches = records.find_by_prefix(session, hex_part)
        if len(matches) > 1:
            shown = ", ".join(m[:19] + "…" for m in matches[:5])
            raise UsageError(f"digest prefix {ref!r} is ambiguous: {shown}")
        if not matches:
            raise RecordNotFoundError(
                "artifact", ref, hint="`enginectl ls` lists what is registered"
            )
        return matches[0]
    digest = records.get_alias(session, ref)
    if digest is None:
        raise RecordNotFoundError(
            "alias or artifact", ref, hint="`enginectl ls` lists artifacts and their aliases"
        )
    return digest
