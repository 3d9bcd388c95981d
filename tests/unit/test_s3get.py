"""Where fetch's GETs go, signed for which region with which keys: where boto3's would go."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from registry.store.s3get import custom_endpoint, environment_settings, first_line


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
        ("Generic S3 error: Error performing GET\n  error: InvalidCertificate(\n  UnknownIssuer",
         ("Generic S3 error: Error performing GET (the server's TLS certificate is not trusted "
          "here: set AWS_CA_BUNDLE to the PEM file of the CA that signed it)")),
        ("", "RuntimeError"),
    ],
)
def test_first_line_of_an_obstore_message(message: str, expected: str) -> None:
    assert first_line(RuntimeError(message)) == expected


KEYS = {"AWS_ACCESS_KEY_ID": "AKID", "AWS_SECRET_ACCESS_KEY": "SECRET"}
NO_CONFIG = {"AWS_CONFIG_FILE": "/nonexistent/aws-config"}


@pytest.mark.parametrize(
    ("endpoint", "environ", "expected"),
    [
        # keys and a custom endpoint, nothing else boto3 could weigh: obstore alone
        ("http://127.0.0.1:9000", {**KEYS, **NO_CONFIG},
         {"endpoint": "http://127.0.0.1:9000", "region": "us-east-1"}),
        ("http://127.0.0.1:9000", {**KEYS, **NO_CONFIG, "AWS_REGION": "eu-west-1",
                                   "AWS_DEFAULT_REGION": "us-west-2"},
         {"endpoint": "http://127.0.0.1:9000", "region": "us-west-2"}),  # botocore's variable
        ("http://127.0.0.1:9000", {**KEYS, **NO_CONFIG, "AWS_REGION": "eu-west-1"},
         {"endpoint": "http://127.0.0.1:9000", "region": "us-east-1"}),  # not read by boto3
        (None, {**KEYS, **NO_CONFIG, "AWS_ENDPOINT_URL_S3": "http://minio:9000",
                "AWS_ENDPOINT_URL": "http://other:9000", "AWS_DEFAULT_REGION": "x-1"},
         {"endpoint": "http://minio:9000", "region": "x-1"}),  # boto3's own endpoint setting
        (None, {**KEYS, **NO_CONFIG, "AWS_ENDPOINT_URL": "http://other:9000"},
         {"endpoint": "http://other:9000", "region": "us-east-1"}),
        ("http://127.0.0.1:9000", {**KEYS, **NO_CONFIG, "AWS_CA_BUNDLE": "/ca.pem"},
         {"endpoint": "http://127.0.0.1:9000"}),  # no TLS: the bundle does not matter
        ("http://127.0.0.1:9000", {**KEYS, **NO_CONFIG, "AWS_SESSION_TOKEN": "TOKEN"},
         {"endpoint": "http://127.0.0.1:9000", "session_token": "TOKEN"}),
        # anything that only boto3 resolves: boto3's session and client
        ("http://127.0.0.1:9000", {**NO_CONFIG}, None),  # no keys: the rest of the chain
        ("http://127.0.0.1:9000", {**NO_CONFIG, "AWS_ACCESS_KEY_ID": "AKID"}, None),
        ("http://127.0.0.1:9000", {**KEYS, **NO_CONFIG, "AWS_PROFILE": "prod"}, None),
        ("https://minio:9000", {**KEYS, **NO_CONFIG, "AWS_CA_BUNDLE": "/ca.pem"},
         {"endpoint": "https://minio:9000"}),  # the reader trusts the bundle itself
        (None, {**KEYS, **NO_CONFIG}, None),  # AWS itself: the bucket's region is asked
        ("https://s3.eu-west-1.amazonaws.com", {**KEYS, **NO_CONFIG}, None),
        (None, {**KEYS, **NO_CONFIG, "AWS_ENDPOINT_URL": "http://other:9000",
                "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS": "true"}, None),
    ],
)
def test_settings_come_from_the_environment_only_when_boto3_could_resolve_nothing_else(
        endpoint: str | None, environ: dict[str, str], expected: dict[str, str] | None) -> None:
    settings = environment_settings(endpoint, environ)
    if expected is None:
        assert settings is None
        return
    assert settings is not None
    assert settings["access_key_id"] == "AKID"
    assert settings["secret_access_key"] == "SECRET"  # noqa: S105 - a test value
    assert settings["virtual_hosted_style_request"] is False
    for name, value in expected.items():
        assert settings[name] == value  # type: ignore[literal-required]
    assert ("session_token" in settings) == ("session_token" in expected)


def test_an_aws_config_file_sends_settings_through_boto3(tmp_path: Path) -> None:
    """It may set a region, an endpoint or the addressing style, which only boto3 reads."""
    config_file = tmp_path / "config"
    config_file.write_text("[default]\nregion = eu-west-1\n")
    environ = {**KEYS, "AWS_CONFIG_FILE": str(config_file)}
    assert environment_settings("http://127.0.0.1:9000", environ) is None
    config_file.unlink()
    assert environment_settings("http://127.0.0.1:9000", environ) is not None


@pytest.mark.parametrize("environ", [
    {**KEYS, **NO_CONFIG},
    {**KEYS, **NO_CONFIG, "AWS_REGION": "eu-west-1"},
    {**KEYS, **NO_CONFIG, "AWS_DEFAULT_REGION": "us-west-2", "AWS_REGION": "eu-west-1"},
    {**KEYS, **NO_CONFIG, "AWS_SESSION_TOKEN": "TOKEN", "AWS_DEFAULT_REGION": "ap-south-1"},
    {**KEYS, **NO_CONFIG, "AWS_ENDPOINT_URL_S3": "http://minio:9000",
     "AWS_ENDPOINT_URL": "http://other:9000"},
    {**KEYS, **NO_CONFIG, "AWS_ENDPOINT_URL": "http://other:9000"},
])
@pytest.mark.parametrize("endpoint", ["http://127.0.0.1:9000", None])
def test_what_comes_from_the_environment_is_what_boto3_resolves(
        monkeypatch: pytest.MonkeyPatch, environ: dict[str, str], endpoint: str | None) -> None:
    """The shortcut must never sign for another region, reach another endpoint or use other
    keys than boto3 would: each is checked against a real boto3 session and client."""
    import boto3

    settings = environment_settings(endpoint, environ)
    if endpoint is None and "AWS_ENDPOINT_URL" not in environ:
        assert settings is None  # AWS itself: boto3 asks the bucket's region
        return
    assert settings is not None
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    session = boto3.session.Session()
    client = session.client("s3", endpoint_url=endpoint)
    credentials = session.get_credentials()
    assert credentials is not None
    frozen = credentials.get_frozen_credentials()
    assert settings["endpoint"] == client.meta.endpoint_url
    assert settings["region"] == (client.meta.region_name or "us-east-1")
    assert (settings["access_key_id"], settings["secret_access_key"]) == (
        frozen.access_key, frozen.secret_key)
    assert settings.get("session_token") == frozen.token
