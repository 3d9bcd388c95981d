"""Exit codes a script can branch on (issue 21, point 6): "not found" (an unknown alias, ref
or model, nothing that serves on this GPU) is exit 6 with the closest known name, never the
exit 4 of an outage; the table is in `enginectl --help` and, the same, in docs/exit-codes.md."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
from pathlib import Path

import pytest

from pipeline.cli.base import EXIT_CODES
from registry.identity.digest import Digest
from registry.identity.layout import manifest_name
from tests.cli_forkserver import ENGINECTL, run_cli
from tests.helpers import ROOT, enginectl
from tests.integration.engines import make_engine
from tests.integration.s3server import CREDENTIALS, S3Server

ALIAS = "llama/h100/prod"


def run(env: dict[str, str], *args: str, code: int, one_line: bool = True) -> str:
    """Run enginectl, expect *code*, and return its (first) error line, or stdout when 0;
    with *one_line*, the error must be one line."""
    done = run_cli([ENGINECTL, *args], env=env, timeout=300)
    assert done.returncode == code, (args, done.stdout, done.stderr)
    if code == 0:
        return done.stdout
    lines = [line for line in done.stderr.splitlines()
             if not line.startswith("enginectl: note: ")]
    assert len(lines) == 1 or not one_line, done.stderr
    assert lines[0].startswith("enginectl: error: "), done.stderr
    return lines[0]


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A registry with one ready engine of model 'llama' on H100, tagged ALIAS."""
    root = tmp_path_factory.mktemp("not-found")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "ENGINECTL_HOME": str(root / "home"),
           "ENGINECTL_CACHE_DIR": str(root / "cache"), "ENGINECTL_VLLM_PYTHON": "python3"}
    engine = make_engine(root / "engine", tp=1)
    digest = json.loads(run(env, "import", str(engine), "--kind", "trtllm-engine", "--model",
                            "llama", "--gpu", "h100", "--ready", "--json", code=0))["digest"]
    run(env, "tag", digest, ALIAS, code=0)
    env["OUT"] = str(root / "out")
    return env


@pytest.mark.parametrize("args", [
    ["show", "llama/h100/prd"],
    ["fetch", "llama/h100/prd", "-o", "OUT"],
    ["pull", "llama/h100/prd", "-o", "OUT"],
    ["logs", "llama/h100/prd"],
    ["tag", "llama/h100/prd", "llama/h100/canary"],
    ["untag", "llama/h100/prd"],
    ["rollback", "llama/h100/prd"],
])
def test_an_unknown_alias_is_exit_6_with_the_closest_one(home: dict[str, str],
                                                         args: list[str]) -> None:
    line = run(home, *[home["OUT"] if a == "OUT" else a for a in args], code=6)
    assert "'llama/h100/prd'" in line
    assert f"did you mean '{ALIAS}'?" in line
    assert not Path(home["OUT"]).exists()


def test_a_name_like_no_alias_gets_no_guess(home: dict[str, str]) -> None:
    line = run(home, "show", "qwen/a10g/dev", code=6)
    assert line.startswith("enginectl: error: no alias or artifact 'qwen/a10g/dev' in the "
                           "registry; `enginectl ls`")
    assert "did you mean" not in line
    assert "no artifact '0123456789abcdef'" in run(home, "show", "0123456789abcdef", code=6)


@pytest.mark.parametrize("verb", ["resolve", "pull"])
def test_an_unknown_model_is_exit_6_with_the_closest_one(home: dict[str, str],
                                                         verb: str) -> None:
    out = ["-o", home["OUT"]] if verb == "pull" else []
    line = run(home, verb, "--model", "lama", "--gpu", "h100", *out, code=6)
    assert "no artifact of model 'lama' in the registry; did you mean 'llama'?" in line
    nothing = run(home, verb, "--model", "llama", "--gpu", "l4", *out, code=6,
                  one_line=False)  # pull lists the rejected artifacts below its error
    assert "L4" in nothing  # known model, nothing for this GPU: not found either
    assert not Path(home["OUT"]).exists()


def test_an_outage_is_still_exit_4(home: dict[str, str]) -> None:
    down = {**home, "ENGINECTL_REGISTRY_URL": "postgresql+psycopg://nobody@127.0.0.1:1/x",
            "ENGINECTL_REGISTRY_RETRY_S": "0"}  # refused is a blip, retried for so long
    for args in (["show", ALIAS], ["resolve", "--model", "llama", "--gpu", "h100"],
                 ["fetch", ALIAS, "-o", home["OUT"]]):
        assert "cannot use registry postgresql+psycopg://nobody@127.0.0.1:1/x" in run(
            down, *args, code=4)


def test_a_registry_that_does_not_answer_is_said_while_it_is_retried(
    home: dict[str, str]
) -> None:
    """A refused connection is retried as a blip for the whole window: a URL with a typo
    must not hang that long without a word (one note, then the error), and -q keeps quiet."""
    down = {**home, "ENGINECTL_REGISTRY_URL": "postgresql+psycopg://nobody@127.0.0.1:1/x",
            "ENGINECTL_REGISTRY_RETRY_S": "2"}
    done = run_cli([ENGINECTL, "show", ALIAS], env=down, timeout=300)
    assert done.returncode == 4, done.stderr
    first, last = done.stderr.strip().splitlines()
    assert first.startswith("enginectl: note: the registry does not answer (")
    assert re.search(r"retrying for up to \d+ s more \(ENGINECTL_REGISTRY_RETRY_S", first)
    assert "cannot use registry postgresql+psycopg://nobody@127.0.0.1:1/x" in last
    quiet = run_cli([ENGINECTL, "show", ALIAS, "-q"], env=down, timeout=300)
    assert quiet.returncode == 4
    assert len(quiet.stderr.strip().splitlines()) == 1, quiet.stderr


def unstored() -> str:
    """A full digest nobody stored: what a script fetches after a typo in a digest."""
    return f"sha256:{secrets.token_hex(32)}"


def test_a_digest_neither_registry_nor_store_has_is_exit_6(home: dict[str, str]) -> None:
    digest = unstored()
    for verb in ("fetch", "pull"):
        line = run(home, verb, digest, "-o", home["OUT"], code=6)
        assert f"no artifact '{digest}' in the registry; the store file://" in line
        assert "has no manifest of it either; `enginectl ls`" in line
        assert not Path(home["OUT"]).exists()


def test_a_store_fault_on_an_unlisted_digest_is_still_exit_4(
    home: dict[str, str], tmp_path: Path
) -> None:
    """What the store cannot say is not "not found": a file store whose folder is not there
    (a volume not mounted), a manifest that is there but damaged, a manifest the registry
    lists but the store lost."""
    missing = {**home, "ENGINECTL_STORE_URL": (tmp_path / "not-mounted").as_uri()}
    for verb in ("fetch", "pull"):
        line = run(missing, verb, unstored(), "-o", home["OUT"], code=4)
        assert f"its folder {tmp_path / 'not-mounted'} does not exist" in line

    store = Path(home["ENGINECTL_HOME"]) / "store"
    for verb in ("fetch", "pull"):
        digest = unstored()
        damaged = store / manifest_name(Digest.parse(digest))
        damaged.write_bytes(b'{"kind": "not this one"}')
        line = run(home, verb, digest, "-o", home["OUT"], code=4)
        assert "integrity check failed" in line
        assert not Path(home["OUT"]).exists()

    root = tmp_path / "lost"
    env = {**home, "ENGINECTL_HOME": str(root / "home"), "ENGINECTL_CACHE_DIR": str(root / "c")}
    listed = json.loads(run(env, "import", str(make_engine(root / "engine", tp=1)), "--kind",
                            "trtllm-engine", "--model", "llama", "--gpu", "h100", "--ready",
                            "--json", code=0))["digest"]
    (root / "home" / "store" / manifest_name(Digest.parse(listed))).unlink()
    shutil.rmtree(root / "c", ignore_errors=True)  # no copy of the manifest in a cache
    for verb in ("fetch", "pull"):
        line = run(env, verb, listed, "-o", home["OUT"], code=4)
        assert f"manifest {listed} not found in" in line


def test_a_digest_the_s3_store_lacks_is_exit_6_and_a_missing_bucket_exit_4(
    home: dict[str, str], s3_server: S3Server, s3_bucket: str
) -> None:
    """A deploy node that has only the bucket (no registry lists the digest)."""
    env = {**home, **CREDENTIALS,
           "ENGINECTL_STORE_URL": f"s3://{s3_bucket}/prefix",
           "ENGINECTL_S3_ENDPOINT_URL": s3_server.endpoint_url}
    digest = unstored()
    for verb in ("fetch", "pull"):
        line = run(env, verb, digest, "-o", home["OUT"], code=6)
        assert f"the store s3://{s3_bucket}/prefix has no manifest of it either" in line
    key = f"prefix/{manifest_name(Digest.parse(digest))}"
    s3_server.client.put_object(Bucket=s3_bucket, Key=key, Body=b"damaged")
    for verb in ("fetch", "pull"):
        assert "integrity check failed" in run(env, verb, digest, "-o", home["OUT"], code=4)
        s3_server.client.put_object(Bucket=s3_bucket, Key=key, Body=b"damaged")  # if set aside
    gone = {**env, "ENGINECTL_STORE_URL": f"s3://{s3_bucket}-gone/prefix"}
    for verb in ("fetch", "pull"):
        assert "does not exist" in run(gone, verb, unstored(), "-o", home["OUT"], code=4)
    assert not Path(home["OUT"]).exists()


def test_the_exit_codes_are_in_help_and_the_page_alike() -> None:
    shown = enginectl(dict(os.environ), "--help").stdout
    for code, meaning in EXIT_CODES:
        assert re.search(rf"^ +{code} +{re.escape(meaning)}$", shown, re.MULTILINE), code
    page = (ROOT / "docs" / "exit-codes.md").read_text(encoding="utf-8")
    table = re.findall(r"^\| `(\d+)` \| (.+?) \|$", page, re.MULTILINE)
    assert [(int(code), meaning) for code, meaning in table] == list(EXIT_CODES)
    assert len(re.findall(r"^Exit codes", page, re.MULTILINE)) == 1  # the one table


@pytest.mark.parametrize("ref", ["!!@@##", "", "sha256:"])
@pytest.mark.parametrize("args", [
    ["show", "REF"], ["fetch", "REF", "-o", "OUT"], ["pull", "REF", "-o", "OUT"],
    ["serve", "REF"], ["logs", "REF"], ["tag", "REF", "llama/h100/canary"], ["smoke", "REF"],
    ["untag", "REF"], ["rollback", "REF"],
])
def test_a_ref_of_no_known_form_is_a_usage_error_naming_the_forms(
    home: dict[str, str], args: list[str], ref: str,
) -> None:
    """Not "not found" (exit 6, the registry's answer to a well-formed ref it lacks): exit 2,
    one line naming what a REF may be (an ALIAS, what an alias name may be), said as the
    command line is parsed, before anything is opened or written."""
    line = run(home, *[{"REF": ref, "OUT": home["OUT"]}.get(a, a) for a in args], code=2)
    assert repr(ref) in line, line
    if args[0] in ("untag", "rollback"):
        assert "is not a valid name" in line, line
    else:
        assert "a digest (sha256:<64 hex>)" in line, line
        assert "12 or more hex digits" in line, line
        assert "an alias (e.g. llama70b/h100/prod)" in line, line
    assert not Path(home["OUT"]).exists()


def test_a_tokenizer_from_that_is_no_directory_nor_ref_is_a_usage_error(
    home: dict[str, str], tmp_path: Path,
) -> None:
    engine = make_engine(tmp_path / "engine", tp=1)
    line = run(home, "import", str(engine), "--kind", "trtllm-engine", "--model", "llama",
               "--gpu", "h100", "--tokenizer-from", str(tmp_path / "no such dir"), code=2)
    assert "is neither a directory nor a REF" in line, line
    assert "a digest (sha256:<64 hex>)" in line, line
