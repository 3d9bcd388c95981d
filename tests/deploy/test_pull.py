"""pull: an entry with its checkpoint, or an engine, in one verified directory with the
command for this node; and what fetch and pull refuse. Every case on the file store and S3,
each with SQLite and PostgreSQL."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.deploy.pull import PullOptions, pull
from pipeline.errors import RuntimeMissingError
from registry.config import RegistryConfig
from registry.context import Context
from registry.errors import (
    IntegrityError,
    ManifestError,
    NothingResolvableError,
    UnknownModelError,
    UnreadyError,
    UsageError,
)
from registry.identity.digest import Digest
from registry.identity.layout import blob_name
from registry.ops.fetch import fetch, load_manifest
from registry.ops.marker import MARKER, SERVE_FILE
from tests.cli_forkserver import ENGINECTL, run_cli
from tests.deploy import artifacts
from tests.helpers import stderr_of

PYTHON = sys.executable  # stands in for vLLM's Python: pull never runs it
ANY_HOST = "0.0.0.0"  # noqa: S104 - pull's default: a deploy node serves other machines


def cli(env: dict[str, str], *args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
    done = run_cli([ENGINECTL, *args], env=env, timeout=300)
    assert done.returncode == code, (args, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    if code:
        assert stderr_of(done).startswith("enginectl: error: "), done.stderr
    return done


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_an_entry_comes_with_its_checkpoint_and_the_command_for_this_node(
    ctx: Context, tmp_path: Path
) -> None:
    source = artifacts.checkpoint(ctx, tmp_path / "ckpt")
    entry = artifacts.vllm_entry(ctx, tmp_path / "entry", source)
    artifacts.alias(ctx, "m/cpu/prod", entry)
    dest = tmp_path / "models"

    pulled = pull(ctx, "m/cpu/prod", str(dest), executable=PYTHON, host=ANY_HOST, port=9001)

    placed = tree(dest)
    assert set(placed) == {"config.json", "model.safetensors", "tokenizer.json",
                           "enginectl-entry.json", SERVE_FILE, MARKER}
    assert placed["model.safetensors"] == (tmp_path / "ckpt" / "model.safetensors").read_bytes()
    argv = pulled.argv
    assert argv[:3] == [PYTHON, "-m", "vllm.entrypoints.openai.api_server"]
    assert artifacts.BUILDER_PYTHON not in argv
    assert argv[argv.index("--model") + 1] == str(dest)
    assert argv[argv.index("--host") + 1] == ANY_HOST
    assert argv[argv.index("--port") + 1] == "9001"
    assert argv.count("--host") == 1
    assert "127.0.0.1" not in argv
    assert not any("{" in part for part in argv)
    serve = json.loads(placed[SERVE_FILE])
    assert serve == pulled.serve_json()
    assert serve["digest"] == entry
    assert serve["sources"] == [entry, source]
    assert (serve["runtime"], serve["executable"], serve["served_model_name"]) == (
        "vllm", PYTHON, "m")
    assert shlex.split(pulled.command) == argv
    assert pulled.downloaded_bytes > 0

    again = pull(ctx, "m/cpu/prod", dest, executable=PYTHON, port=9001)  # a previous pull
    assert again.downloaded_bytes == 0  # every blob from the cache
    assert again.cached_bytes == pulled.downloaded_bytes + pulled.cached_bytes
    assert tree(dest) == placed | {SERVE_FILE: tree(dest)[SERVE_FILE]}
    other = pull(ctx, entry, tmp_path / "other", executable=PYTHON)
    assert other.downloaded_bytes == 0
    assert other.argv[other.argv.index("--host") + 1] == ANY_HOST  # the default
    assert not [p for p in tmp_path.iterdir() if ".pull-" in p.name]  # no staging left


def test_an_engine_serves_itself_and_an_imported_one_gets_trtllm_serves_command(
    ctx: Context, tmp_path: Path
) -> None:
    recorded = artifacts.engine(ctx, tmp_path / "recorded")
    imported = artifacts.engine(ctx, tmp_path / "imported", seed=1, recorded=False)
    for digest in (recorded, imported):
        dest = tmp_path / f"out-{digest[7:15]}"
        pulled = pull(ctx, digest, dest, executable=sys.executable, host="127.0.0.1", port=8123)
        assert set(tree(dest)) == {"config.json", "rank0.engine", "tokenizer.json", SERVE_FILE,
                                   MARKER, "tokenizer/config.json", "tokenizer/tokenizer.json",
                                   "tokenizer/tokenizer_config.json"}
        assert pulled.sources == (digest,)
        argv = pulled.argv
        assert argv[1:4] == [str(dest), "--backend", "tensorrt"]
        assert argv[argv.index("--tokenizer") + 1] == str(dest / "tokenizer")
        assert pulled.tokenizer_dir == str(dest / "tokenizer")
        assert argv[argv.index("--port") + 1] == "8123"
        assert argv[argv.index("--tp_size") + 1] == "1"
        assert argv[argv.index("--max_seq_len") + 1] == "256"
        assert pulled.served_model_name == dest.name  # trtllm-serve names a model by its dir
    with pytest.raises(RuntimeMissingError, match="--executable '/no/such/trtllm-serve' is not"):
        pull(ctx, recorded, tmp_path / "x", executable="/no/such/trtllm-serve")
    assert not (tmp_path / "x").exists()


def test_pull_by_model_resolves_for_the_gpu_and_says_why_nothing_fits(
    ctx: Context, tmp_path: Path
) -> None:
    source = artifacts.checkpoint(ctx, tmp_path / "ckpt", model="tiny-llama")
    entry = artifacts.vllm_entry(ctx, tmp_path / "entry", source, model="tiny-llama")
    artifacts.smoked(ctx, entry, "CPU", 50.0)
    pulled = pull(ctx, None, tmp_path / "cpu", model="tiny-llama", gpu="cpu",
                  executable=PYTHON)
    assert pulled.digest == entry
    assert pulled.notes == ()
    # proven on the CPU only: an H100 node is not handed it, and is told where it is proven
    with pytest.raises(NothingResolvableError) as elsewhere:
        pull(ctx, None, tmp_path / "h100", model="tiny-llama", gpu="h100", executable=PYTHON)
    assert elsewhere.value.exit_code == 6
    assert str(elsewhere.value).splitlines() == [
        ("nothing to serve tiny-llama on H100-SXM5-80GB: 1 artifacts rejected; `enginectl "
        "resolve --model tiny-llama --gpu H100-SXM5-80GB --explain` lists the same; build, "
        "smoke or tag one for this GPU; --allow-unproven takes one proven only elsewhere"),
        f"  {entry[:19]}… vllm: unproven on H100-SXM5-80GB (proven on CPU)"]
    assert not (tmp_path / "h100").exists()
    on_h100 = pull(ctx, None, tmp_path / "h100", model="tiny-llama", gpu="h100",
                   executable=PYTHON, options=PullOptions(allow_unproven=True))
    assert on_h100.digest == entry
    note = (f"{entry} is unproven on H100-SXM5-80GB (proven on CPU); "
            f"`enginectl smoke {entry[:19]}` here proves it")
    assert on_h100.notes == (note,)
    assert on_h100.unproven == "unproven on H100-SXM5-80GB (proven on CPU)"
    served = json.loads((tmp_path / "h100" / SERVE_FILE).read_text())
    assert served["unproven"] == "unproven on H100-SXM5-80GB (proven on CPU)"
    assert json.loads((tmp_path / "cpu" / SERVE_FILE).read_text())["unproven"] is None
    with pytest.raises(UnknownModelError, match="did you mean 'tiny-llama'"):
        pull(ctx, None, tmp_path / "x", model="tiny-lama", gpu="cpu", executable=PYTHON)
    artifacts.set_status(ctx, entry, "quarantined", "smoke failed: greedy: wrong output")
    with pytest.raises(NothingResolvableError) as raised:
        pull(ctx, None, tmp_path / "x", model="tiny-llama", gpu="cpu", executable=PYTHON)
    lines = str(raised.value).splitlines()
    assert lines[0].startswith("nothing to serve tiny-llama on CPU: 1 artifacts rejected; "
                               "`enginectl resolve --model tiny-llama --gpu CPU --explain`")
    assert lines[1:] == [f"  {entry[:19]}… vllm: not ready (status quarantined)"]
    assert raised.value.exit_code == 6  # not found: nothing here serves it
    assert not (tmp_path / "x").exists()


def test_only_proven_artifacts_are_pulled_unless_allowed(ctx: Context, tmp_path: Path) -> None:
    source = artifacts.checkpoint(ctx, tmp_path / "ckpt")
    built = artifacts.vllm_entry(ctx, tmp_path / "built", source, status="built")
    with pytest.raises(UnreadyError, match=f"artifact {built} is built .*pull takes it only "
                       "with --allow-unready") as raised:
        pull(ctx, built, tmp_path / "x", executable=PYTHON)
    assert raised.value.exit_code == 4
    allowed = pull(ctx, built, tmp_path / "x", executable=PYTHON,
                   options=PullOptions(allow_unready=True))
    assert allowed.notes == (f"{built} is built; pulled because of --allow-unready",)
    artifacts.set_status(ctx, built, "superseded", "replaced by a faster entry")
    assert "as a rollback" in pull(ctx, built, tmp_path / "y", executable=PYTHON).notes[0]
    artifacts.set_status(ctx, built, "quarantined", "smoke failed: chat: HTTP 500")
    artifacts.alias(ctx, "m/prod", built)
    with pytest.raises(UnreadyError, match=r"is quarantined \(smoke failed: chat: HTTP 500\)"):
        pull(ctx, "m/prod", tmp_path / "z", executable=PYTHON)
    with pytest.raises(UnreadyError, match="quarantined"):
        fetch(ctx, "m/prod", tmp_path / "z")
    assert not (tmp_path / "z").exists()
    fetched = fetch(ctx, "m/prod", tmp_path / "z", allow_unready=True)
    assert "fetched because of --allow-unready" in fetched.notes[0]
    # intermediates are never smoke-tested: a checkpoint fetches without a word
    assert fetch(ctx, source, tmp_path / "ckpt-out").notes == ()
    with pytest.raises(ManifestError, match="not served by a runtime"):
        pull(ctx, source, tmp_path / "ckpt-pull", executable=PYTHON,
             options=PullOptions(allow_unready=True))


def test_a_path_in_the_entry_and_its_checkpoint_must_have_the_same_content(
    ctx: Context, tmp_path: Path
) -> None:
    source = artifacts.checkpoint(ctx, tmp_path / "ckpt")
    clash = artifacts.vllm_entry(ctx, tmp_path / "clash", source,
                                 extra={"config.json": b'{"other": 1}'})
    with pytest.raises(ManifestError, match=r"'config\.json' is in .* with different content"):
        pull(ctx, clash, tmp_path / "x", executable=PYTHON)
    same = artifacts.vllm_entry(ctx, tmp_path / "same", source,
                                extra={"tokenizer.json": b'{"version": "1.0"}'})
    assert "tokenizer.json" in tree(pull(ctx, same, tmp_path / "y", executable=PYTHON)
                                    .directory)
    holds_serve_json = artifacts.vllm_entry(ctx, tmp_path / "sj", source,
                                            extra={SERVE_FILE: b"{}"})
    with pytest.raises(ManifestError, match=r"has a file 'serve\.json', which pull writes"):
        pull(ctx, holds_serve_json, tmp_path / "z", executable=PYTHON)


def _flip_one_byte(ctx: Context, digest: Digest, tmp_path: Path) -> None:
    copy = tmp_path / "blob"
    ctx.store.get_blob(digest, copy)
    data = bytearray(copy.read_bytes())
    data[len(data) // 2] ^= 0xFF
    if ctx.store.url.startswith("file://"):
        path = Path(ctx.store.url.removeprefix("file://")) / blob_name(digest)
        path.chmod(0o644)
        path.write_bytes(bytes(data))
    else:
        import boto3

        bucket, _, prefix = ctx.store.url.removeprefix("s3://").partition("/")
        client = boto3.client("s3", endpoint_url=ctx.config.s3_endpoint_url)
        client.put_object(Bucket=bucket, Key=f"{prefix}/{blob_name(digest)}", Body=bytes(data))


def test_a_damaged_checkpoint_blob_fails_the_pull_and_leaves_the_directory_as_it_was(
    ctx: Context, tmp_path: Path
) -> None:
    source = artifacts.checkpoint(ctx, tmp_path / "ckpt")
    entry = artifacts.vllm_entry(ctx, tmp_path / "entry", source)
    first = artifacts.vllm_entry(ctx, tmp_path / "first", artifacts.checkpoint(
        ctx, tmp_path / "ckpt2", seed=2))
    dest = tmp_path / "models"
    pull(ctx, first, dest, executable=PYTHON)
    before = tree(dest)
    weights = next(f for f in load_manifest(ctx, source).files if f.path == "model.safetensors")
    _flip_one_byte(ctx, weights.xxh3, tmp_path)
    with pytest.raises(IntegrityError, match=r"model\.safetensors"):
        pull(ctx, entry, dest, executable=PYTHON)
    assert tree(dest) == before
    assert not [p for p in tmp_path.iterdir() if ".pull-" in p.name]


def test_a_directory_that_holds_something_else_is_refused_with_or_without_force(
    ctx: Context, tmp_path: Path
) -> None:
    entry = artifacts.vllm_entry(ctx, tmp_path / "entry",
                                 artifacts.checkpoint(ctx, tmp_path / "ckpt"))
    dest = tmp_path / "models"
    dest.mkdir()
    (dest / "mine.txt").write_text("keep me")
    with pytest.raises(UsageError, match="is not empty and holds no earlier pull"):
        pull(ctx, entry, dest, executable=PYTHON)
    with pytest.raises(UsageError, match="--force replaces only a directory pull or fetch"):
        pull(ctx, entry, dest, executable=PYTHON, options=PullOptions(force=True))
    assert tree(dest) == {"mine.txt": b"keep me"}


def test_the_cli_prints_the_command_and_refuses_what_is_not_proven(
    ctx: Context, deploy_env: dict[str, str], tmp_path: Path
) -> None:
    source = artifacts.checkpoint(ctx, tmp_path / "ckpt")
    entry = artifacts.vllm_entry(ctx, tmp_path / "entry", source)
    artifacts.alias(ctx, "m/cpu/prod", entry)
    env = {**deploy_env, "ENGINECTL_VLLM_PYTHON": PYTHON}
    dest = tmp_path / "models"

    done = cli(env, "pull", "m/cpu/prod", "-o", str(dest), "--port", "9002")
    argv = shlex.split(done.stdout.strip())
    assert len(done.stdout.strip().splitlines()) == 1  # stdout is the command alone
    assert argv == json.loads((dest / SERVE_FILE).read_text())["argv"]
    assert argv[0] == PYTHON
    assert f"pulled {entry} (vllm with its checkpoint {source}) into {dest}" in done.stderr
    as_json = json.loads(cli(env, "pull", "m/cpu/prod", "-o", str(dest), "--json").stdout)
    assert as_json["downloaded_bytes"] == 0
    assert as_json["directory"] == str(dest)

    # by model: only what passed a smoke on this node's SKU, unless --allow-unproven
    artifacts.smoked(ctx, entry, "CPU", 50.0)
    h100 = ["--model", "m", "--gpu", "h100"]
    elsewhere = "unproven on H100-SXM5-80GB (proven on CPU)"
    refused = cli(env, "pull", *h100, "-o", str(tmp_path / "h100"), code=6)
    assert f"  {entry[:19]}… vllm: {elsewhere}" in refused.stderr.splitlines()
    assert "; --allow-unproven takes one proven only elsewhere" in refused.stderr
    refused = cli(env, "resolve", *h100, code=6)
    assert (f"unproven on H100-SXM5-80GB: {entry[:19]}… vllm (proven on CPU); "
            "--allow-unproven takes them" in refused.stderr)
    assert not (tmp_path / "h100").exists()
    taken = cli(env, "pull", *h100, "--allow-unproven", "-o", str(tmp_path / "h100"), "--json")
    assert json.loads(taken.stdout)["unproven"] == elsewhere
    assert json.loads((tmp_path / "h100" / SERVE_FILE).read_text())["unproven"] == elsewhere
    assert f"{entry} is {elsewhere}; `enginectl smoke" in taken.stderr
    ranked = cli(env, "resolve", *h100, "--allow-unproven").stdout
    assert ranked.startswith(f"1. {entry}")
    assert "(unproven on H100-SXM5-80GB)" in ranked
    on_ref = cli(env, "pull", "m/cpu/prod", "--allow-unproven", "-o", str(tmp_path / "r"),
                 code=2)
    assert "--allow-unproven is for --model" in on_ref.stderr
    # --gpu auto with no nvidia-smi here: the entry proven on the CPU is the way out
    no_smi = {**env, "PATH": "/usr/bin:/bin"}
    for verb, out in (("pull", ["-o", str(tmp_path / "auto")]), ("serve", []),
                      ("resolve", ["--gpu", "auto"])):
        auto = cli(no_smi, verb, "--model", "m", *out, code=2)
        assert stderr_of(auto) == (
            "enginectl: error: --gpu auto reads nvidia-smi, which is not on this machine; m "
            f"has a vLLM entry proven on the CPU ({entry[:19]}…): pass --gpu cpu to serve it "
            "here, or --gpu SKU\n")
    assert not (tmp_path / "auto").exists()

    artifacts.set_status(ctx, entry, "quarantined", "smoke failed: greedy: wrong output")
    for verb in ("pull", "fetch"):
        refused = cli(env, verb, "m/cpu/prod", "-o", str(tmp_path / verb), code=4)
        assert len(stderr_of(refused).strip().splitlines()) == 1
        said = (f"artifact {entry} is quarantined (smoke failed: greedy: wrong output): "
                f"{verb} takes it only with --allow-unready")
        assert said in refused.stderr
        assert not (tmp_path / verb).exists()
    allowed = cli(env, "fetch", "m/cpu/prod", "-o", str(tmp_path / "f"), "--allow-unready")
    assert "enginectl: note: " in stderr_of(allowed)
    artifacts.set_status(ctx, entry, "built")
    unproven = cli(env, "fetch", entry, "-o", str(tmp_path / "g"))
    assert f"{entry} is built, not yet proven to serve" in unproven.stderr
    checkpoint = cli(env, "fetch", source, "-o", str(tmp_path / "h"))
    assert stderr_of(checkpoint) == ""
    assert (tmp_path / "h" / "model.safetensors").is_file()

    unknown = cli(env, "pull", "--model", "nope", "--gpu", "cpu", "-o", str(tmp_path / "i"),
                  code=6)
    assert "no artifact of model 'nope'" in unknown.stderr
    nothing = cli(env, "pull", "--model", "m", "--gpu", "cpu", "-o", str(tmp_path / "i"),
                  code=6)
    lines = stderr_of(nothing).strip().splitlines()
    assert lines[0].startswith("enginectl: error: nothing to serve m on CPU: 1 artifacts "
                               "rejected")
    assert lines[1] == f"  {entry[:19]}… vllm: not ready (status built)"
    both = cli(env, "pull", entry, "--model", "m", "-o", str(tmp_path / "i"), code=2)
    assert "give a REF or --model, not both" in both.stderr
    neither = cli(env, "pull", "-o", str(tmp_path / "i"), code=2)
    assert "give a REF (digest, prefix or alias) or --model MODEL" in neither.stderr
    no_gpu = cli({**env, "PATH": "/usr/bin:/bin"}, "pull", "--model", "m", "-o",
                 str(tmp_path / "i"), code=2)
    assert "--gpu auto reads nvidia-smi, which is not on this machine" in no_gpu.stderr


def test_a_missing_runtime_is_the_machines_fault_not_the_artifacts(
    ctx: Context, deploy_env: dict[str, str], tmp_path: Path
) -> None:
    entry = artifacts.vllm_entry(ctx, tmp_path / "entry",
                                 artifacts.checkpoint(ctx, tmp_path / "ckpt"))
    env = {**deploy_env, "ENGINECTL_VLLM_PYTHON": "/no/such/python"}
    missing = cli(env, "pull", entry, "-o", str(tmp_path / "x"), code=2)
    assert stderr_of(missing).strip() == (
        "enginectl: error: cannot serve a vllm artifact on this machine: "
        "ENGINECTL_VLLM_PYTHON='/no/such/python' is not an executable file")
    assert not (tmp_path / "x").exists()
    with ctx.registry.session(readonly=True) as session:
        from registry.sql import records

        record = records.get_artifact(session, entry)
    assert record is not None
    assert (record.status, record.status_reason) == ("ready", None)  # nothing blamed on it


def test_pull_by_ref_never_imports_sqlalchemy(ctx: Context, deploy_env: dict[str, str],
                                              tmp_path: Path) -> None:
    """A pull by REF reads the registry like fetch, on the database driver alone; with the
    S3 keys in the environment its bytes come through obstore without boto3, and once its
    blobs and manifests are in the cache it does not even open the store."""
    entry = artifacts.vllm_entry(ctx, tmp_path / "entry",
                                 artifacts.checkpoint(ctx, tmp_path / "ckpt"))
    artifacts.alias(ctx, "m/prod", entry)
    script = ("import sys\nfrom registry.context import Context\n"
              "from pipeline.deploy.pull import pull\n"
              f"done = pull(Context(), 'm/prod', sys.argv[1], executable={PYTHON!r})\n"
              "print(done.downloaded_bytes, sorted({m.split('.')[0] for m in sys.modules} & "
              "{'sqlalchemy', 'alembic', 'torch', 'ray', 'boto3', 'botocore'}))\n")

    def pulled_in_a_fresh_interpreter(out: str) -> str:
        done = subprocess.run([sys.executable, "-c", script, str(tmp_path / out)],
                              env=deploy_env, capture_output=True, text=True, timeout=120,
                              check=False)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    first = pulled_in_a_fresh_interpreter("first")
    assert int(first.split(" ", 1)[0]) > 0
    assert first.split(" ", 1)[1] == "[]"
    assert pulled_in_a_fresh_interpreter("second") == "0 []"  # a cache hit, store unopened


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare(1)")
def test_a_mount_point_is_filled_in_place_with_serve_json_last(tmp_path: Path) -> None:
    """`-o /models` where /models is a volume: it cannot be renamed, so the pull moves its
    entries in (a private tmpfs mount in a user namespace stands in for the volume). Once,
    on the file store and SQLite: what differs is the target, not the store."""
    config = RegistryConfig.from_env({"ENGINECTL_HOME": str(tmp_path / "home")})
    with Context(config) as ctx:
        entry = artifacts.vllm_entry(ctx, tmp_path / "entry",
                                     artifacts.checkpoint(ctx, tmp_path / "ckpt"))
    volume = tmp_path / "volume"
    volume.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGINECTL_")}
    env.update(ENGINECTL_HOME=str(config.home), ENGINECTL_VLLM_PYTHON=PYTHON)
    quoted = shlex.quote(str(volume))
    script = (f"mount -t tmpfs none {quoted} && mountpoint -q {quoted} && "
              f"{ENGINECTL} pull {entry} -o {quoted} && "
              f"{ENGINECTL} pull {entry} -o {quoted} --json && ls -A {quoted}")
    done = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                           script], env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    if done.returncode != 0 and done.stderr.startswith("unshare:"):
        pytest.skip(f"user namespaces are not allowed here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    second = json.loads(lines[1])
    assert second["directory"] == str(volume)
    assert second["downloaded_bytes"] == 0  # the second pull was a cache hit
    assert sorted(lines[2:]) == sorted(["config.json", "enginectl-entry.json", MARKER,
                                        "model.safetensors", SERVE_FILE, "tokenizer.json"])
    assert list(volume.iterdir()) == []  # outside the namespace the volume was never touched
