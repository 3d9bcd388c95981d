"""The one parser of refs (`registry.identity.refs.check_ref`): what has the form of a
digest, a digest prefix or an alias passes as it is; anything else is a usage error (exit 2)
that names the forms, whoever asks (the CLI's REF, the Python API's resolve)."""

from __future__ import annotations

import pytest

from registry.errors import UsageError
from registry.identity.refs import check_ref, resolve_with

DIGEST = "sha256:" + "9f86d081884c" * 5 + "abcd"


@pytest.mark.parametrize("ref", [DIGEST, DIGEST.removeprefix("sha256:"), "9f86d081884c",
                                 "sha256:9f86d081884c", "llama70b/h100/prod", "m", "a.b_c-d"])
def test_each_form_passes_as_it_is(ref: str) -> None:
    assert check_ref(ref) == ref


@pytest.mark.parametrize(("ref", "why"), [
    ("!!@@##", "is not a digest, a digest prefix or an alias name"),
    ("", "is empty"),
    ("   ", "is empty"),
    ("sha256:", "has no hex digits after 'sha256:'"),
    ("Llama/H100", "did you mean 'llama/h100'?"),
    ("SHA256:9F86D081884C", "did you mean 'sha256:9f86d081884c'?"),
    ("9f86d0", "is too short: give at least 12 hex digits"),
    (DIGEST + "0", "has more hex digits than a digest (64)"),
    ("a/../b", "is not a digest"),
    ("xxh3-128:" + "0" * 32, "is not a digest"),
])
def test_anything_else_is_a_usage_error_naming_the_forms(ref: str, why: str) -> None:
    with pytest.raises(UsageError) as refused:
        check_ref(ref)
    assert repr(ref) in str(refused.value)
    assert why in str(refused.value)
    assert refused.value.exit_code == 2
    if "too short" not in why:
        assert "a digest (sha256:<64 hex>)" in str(refused.value)


def test_resolving_parses_first_and_asks_the_registry_nothing() -> None:
    class Never:
        def find_by_prefix(self, _hex_prefix: str) -> list[str]:
            raise AssertionError("the registry was asked")

        def get_alias(self, _name: str) -> str | None:
            raise AssertionError("the registry was asked")

        def alias_names(self) -> list[str]:
            raise AssertionError("the registry was asked")

    with pytest.raises(UsageError):
        resolve_with("!!@@##", Never())
