"""Refs: what users type for an artifact — a full digest, a unique prefix of at least 12 hex
digits (with or without `sha256:`), or an alias name. The rules only: reading them against a
database is `registry.sql.refs` (SQLAlchemy) and `registry.sql.lookup` (the driver alone).

`check_ref` is the one parser: what has none of those forms (`!!@@##`, an empty string,
`sha256:` alone) is a usage error (exit 2) naming them, never "not found" (exit 6), which is
the registry's answer to a well-formed ref it does not hold. The CLI checks each REF with it
as it parses the command line (`pipeline.cli.base.REF`), before anything is opened."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final, Protocol

from registry.errors import RecordNotFoundError, UsageError, did_you_mean

MIN_PREFIX: Final = 12
DIGEST_HEX: Final = 64
_HEX: Final = re.compile(r"^(sha256:)?[0-9a-f]+$")
FORMS: Final = (f"a digest (sha256:<{DIGEST_HEX} hex>), a prefix of one ({MIN_PREFIX} or more "
                "hex digits, e.g. 9f86d081884c), or an alias (e.g. llama70b/h100/prod)")
"""What a ref may be, for messages."""
ALIAS_NAME: Final = re.compile(r"^[a-z0-9][a-z0-9._/-]{0,199}$")


def valid_alias_name(name: str) -> bool:
    """Whether *name* is an alias name: lowercase letters, digits, `.`, `_`, `-` and `/`
    between segments that are neither empty nor `.` or `..`, and not all hex digits."""
    return (
        ALIAS_NAME.fullmatch(name) is not None
        and not _HEX.match(name)
        and all(part not in ("", ".", "..") for part in name.split("/"))
    )


def check_alias_name(name: str) -> str:
    if not valid_alias_name(name):
        raise UsageError(
            f"alias {name!r} is not a valid name: lowercase letters, digits, '.', '_', '-', "
            "and '/' between parts that are not empty, '.' or '..'; not all hex digits (that "
            "would read as a digest prefix); e.g. llama70b/h100/prod"
        )
    return name


def check_ref(ref: str) -> str:
    """*ref* when it has the form of a ref: a digest or a digest prefix (lowercase hex, with
    or without `sha256:`, no longer than a digest) or an alias name; UsageError naming the
    forms otherwise. Whether it names anything is the registry's to say. Pure."""
    if _HEX.match(ref):
        digits = len(ref.removeprefix("sha256:"))
        if digits < MIN_PREFIX:
            raise UsageError(f"digest prefix {ref!r} is too short: give at least {MIN_PREFIX} "
                             "hex digits")
        if digits > DIGEST_HEX:
            raise UsageError(f"{ref!r} has more hex digits than a digest ({DIGEST_HEX}); "
                             f"give {FORMS}")
        return ref
    if valid_alias_name(ref):
        return ref
    if not ref.strip():
        why = "is empty"
    elif ref.removeprefix("sha256:") == "":
        why = "has no hex digits after 'sha256:'"
    elif ref.lower() != ref and (_HEX.match(ref.lower()) or valid_alias_name(ref.lower())):
        why = f"has capital letters (did you mean {ref.lower()!r}?)"
    else:
        why = "is not a digest, a digest prefix or an alias name"
    raise UsageError(f"{ref!r} {why}: give {FORMS}")


def unknown_alias(what: str, name: str, known: Iterable[str]) -> RecordNotFoundError:
    """RecordNotFoundError (exit 6) for the alias *name*, with the closest known alias."""
    close = did_you_mean(name, known).removeprefix("; ")
    return RecordNotFoundError(
        what, name, hint=f"{close + ' ' if close else ''}`enginectl ls` lists artifacts and "
                         "their aliases")


class RefReader(Protocol):
    """What resolving a ref reads of a registry. Two backends serve it: a session of the
    ORM (`registry.sql.refs.SessionReader`) and the database driver alone
    (`registry.sql.lookup.DriverReader`, on the fetch and pull path)."""

    def find_by_prefix(self, hex_prefix: str) -> list[str]:
        """The registered digests whose hex starts with *hex_prefix*, sorted."""
        ...

    def get_alias(self, name: str) -> str | None:
        """The digest the alias *name* points at; None when there is no such alias."""
        ...

    def alias_names(self) -> list[str]:
        """Every alias name (for "did you mean")."""
        ...


def resolve_with(ref: str, reader: RefReader) -> str:
    """The rules of resolving a ref over either backend of the registry (`RefReader`); the
    aliases are listed only when *ref* names none. UsageError for a ref of no known form
    (`check_ref`), before the registry is asked anything."""
    if _HEX.match(check_ref(ref)):
        hex_part = ref.removeprefix("sha256:")
        matches = reader.find_by_prefix(hex_part)
        if len(matches) > 1:
            shown = ", ".join(m[:19] + "…" for m in matches[:5])
            raise UsageError(f"digest prefix {ref!r} is ambiguous: {shown}")
        if not matches:
            raise RecordNotFoundError(
                "artifact", ref, hint="`enginectl ls` lists what is registered"
            )
        return matches[0]
    digest = reader.get_alias(ref)
    if digest is None:
        raise unknown_alias("alias or artifact", ref, reader.alias_names())
    return digest
