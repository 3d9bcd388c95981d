"""Where fetch's ranged GETs go when no ENGINECTL_S3_ENDPOINT_URL is set: where boto3's go."""

from __future__ import annotations

import pytest

from registry.s3get import custom_endpoint, first_line


@pytest.mark.parametrize(
    ("resolved", "expected"),
    [
        ("https://s3.amazonaws.com", None),  # AWS: obstore derives it from the bucket's region
        ("https://s3.eu-west-1.amazonaws.com", None),
        ("https://s3.cn-north-1.amazonaws.com.cn", None),
        ("http://127.0.0.1:9000", "http://127.0.0.1:9000"),  # set through boto3's own settings
        ("https://minio.internal:9000", "https://minio.internal:9000"),
        ("https://amazonaws.com.example.org", "https://amazonaws.com.example.org"),
        (None, None),
        ("", None),
    ],
)
def test_custom_endpoint(resolved: str | None, expected: str | None) -> None:
    assert custom_endpoint(resolved) == expected


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("Generic S3 error: Error performing GET\n  source: reqwest::Error {\n  }",
         "Generic S3 error: Error performing GET"),
        ("  one line  ", "one line"),
        ("", "RuntimeError"),
    ],
)
def test_first_line_of_an_obstore_message(message: str, expected: str) -> None:
    assert first_line(RuntimeError(message)) == expected
