"""Versions in the forms real images print them (pipeline.planning.versions)."""

from __future__ import annotations

import pytest

from pipeline.planning.versions import cuda_release, fingerprint_version


@pytest.mark.parametrize(("printed", "value"), [
    # TensorRT as the release image's wheel prints it: all four parts count
    ("10.14.1.48", "10.14.1.48"),
    ("10.13.3.9", "10.13.3.9"),
    ("10.14.1.48.post1", "10.14.1.48.post1"),
    # NGC torch: the source commit stays, the container release goes
    ("2.9.0a0+145a3a7bda.nv25.10", "2.9.0a0+145a3a7bda"),
    ("2.10.0a0+b4e4ee81d3.nv25.12", "2.10.0a0+b4e4ee81d3"),
    ("2.8.0a0+5228986c39.nv25.5", "2.8.0a0+5228986c39"),
    # TRT-LLM release candidates and releases
    ("1.2.0rc1", "1.2.0rc1"),
    ("1.2.0rc6.post3", "1.2.0rc6.post3"),
    ("1.2.1", "1.2.1"),
    # local build tags: the CUDA a wheel was built for is the `cuda` field
    ("2.13.0+cpu", "2.13.0"),
    ("2.9.1+cu130", "2.9.1"),
    ("0.32.0", "0.32.0"),
    # git describe
    ("0.6.4.dev12+g1234abc.cu124", "0.6.4.dev12+g1234abc"),
    # blank and unknown forms
    (None, None),
    ("", None),
    ("  4.57.3\n", "4.57.3"),
    ("weird-1", "weird-1"),
])
def test_fingerprint_version(printed: str | None, value: str | None) -> None:
    assert fingerprint_version(printed) == value


def test_versions_that_differ_in_what_matters_stay_different() -> None:
    assert fingerprint_version("10.14.1.48") != fingerprint_version("10.14.1.46")
    assert (fingerprint_version("2.9.0a0+145a3a7bda.nv25.10")
            != fingerprint_version("2.9.0a0+5228986c39.nv25.10"))
    assert fingerprint_version("1.2.0rc1") != fingerprint_version("1.2.0")


@pytest.mark.parametrize(("printed", "value"), [
    ("12.9", "12.9"), ("13.0", "13.0"), ("13.0.2.006", "13.0"), ("12.9.1.010", "12.9"),
    (None, None), (" ", None), ("n/a", "n/a"),
])
def test_cuda_release(printed: str | None, value: str | None) -> None:
    assert cuda_release(printed) == value
