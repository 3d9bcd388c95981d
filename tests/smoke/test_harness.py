"""smoke() against tests/fakes/openai_server.py: a passing report and each way to fail."""

from __future__ import annotations

import json
import socket
import sys
import uuid
from pathlib import Path

from pipeline.recipe.schema import SmokeSettings
from pipeline.serving.loadgen import cost_per_million_tokens
from pipeline.serving.server import free_port, render_argv
from pipeline.serving.smoke import SmokeReport, SmokeServer, measure, smoke
from tests.fakes.openai_server import Fake
from tests.processes import FAKE_NAME, TAG, tagged_processes

CHECKS = ["ready", "models", "greedy", "chat", "stream", "long_prompt"]


def run(argv: list[str], model_dir: Path, settings: SmokeSettings, tmp_path: Path, *,
        env: dict[str, str] | None = None, max_input_len: int = 240,
        price_per_hour: float | None = 3.6, served_name: str = FAKE_NAME,
        reference: list[tuple[str, str]] | None = None, threshold: float | None = None,
        ) -> SmokeReport:
    tag = uuid.uuid4().hex
    server = SmokeServer(argv, model_dir, served_name, tmp_path / "logs" / "smoke.log",
                         env={**(env or {}), TAG: tag})
    report = smoke(server, settings=settings, max_input_len=max_input_len,
                   price_per_hour=price_per_hour, reference=reference, threshold=threshold)
    assert tagged_processes(tag) == [], "the server outlived smoke()"
    return report


def failed_names(report: SmokeReport) -> list[str]:
    return [check.name for check in report.checks if not check.passed]


def test_a_good_server_passes_every_check_and_level(
    fake_argv: list[str], model_dir: Path, settings: SmokeSettings, tmp_path: Path
) -> None:
    report = run(fake_argv, model_dir, settings, tmp_path)

    assert report.passed, report.failure
    assert report.failure is None
    assert [check.name for check in report.checks] == [*CHECKS, "load"]
    assert report.ready_s is not None
    assert report.ready_s > 0
    greedy = report.check("greedy")
    assert greedy is not None
    assert greedy.evidence["ignore_eos"] == "accepted"
    assert [o["completion_tokens"] for o in greedy.evidence["outputs"]] == [4, 4]
    assert [o["text"] for o in greedy.evidence["outputs"]] == [
        "".join(Fake.generate(prompt, 4)) for prompt in settings.prompts]
    stream = report.check("stream")
    assert stream is not None
    assert stream.evidence["chunks"] == 4
    assert stream.evidence["completion_tokens"] == 4
    assert stream.evidence["ttft_s"] is not None
    long_prompt = report.check("long_prompt")
    assert long_prompt is not None
    assert long_prompt.evidence["counted_by"] == "/tokenize"
    assert long_prompt.evidence["expected"] == long_prompt.evidence["reported"] == 240 - 8

    assert [level.concurrency for level in report.load] == [1, 3]
    for level in report.load:
        assert level.requests == 5
        assert level.errors == 0
        assert level.output_tokens == 5 * 4
        assert level.ttft_p50_s is not None
        assert level.ttft_p95_s is not None
        assert level.ttft_p50_s <= level.ttft_p95_s
    best = max(level.output_tokens_per_s for level in report.load)
    assert report.best_output_tokens_per_s == best
    assert report.cost_per_million_tokens == cost_per_million_tokens(3.6, best)

    data = json.loads(json.dumps(report.as_dict()))  # plain JSON all the way down
    assert data["passed"] is True
    assert data["best_output_tokens_per_s"] == best
    assert len(data["load"]) == 2
    assert data["argv"][-1] == "--enforce-eager"
    assert "{port}" not in " ".join(data["argv"])
    assert "fake-openai: serving 'fake-model'" in (tmp_path / "logs" / "smoke.log").read_text()


def test_a_port_taken_before_the_server_binds_it_is_tried_again_never_blamed_on_the_artifact(
    fake_argv: list[str], model_dir: Path, settings: SmokeSettings, tmp_path: Path
) -> None:
    """free_port finds a port free; on a busy machine another process can take it before the
    server binds it (the server dies: Address already in use). smoke and measure start again
    on another port: a verdict about the artifact is never a lost race of the machine's."""
    taken = tmp_path / "taken-once"
    report = run(fake_argv, model_dir, settings, tmp_path,
                 env={"FAKE_OPENAI_PORT_TAKEN_ONCE": str(taken)})
    assert taken.exists()  # the first start did lose its port
    assert report.passed, report.failure
    taken = tmp_path / "measure-taken-once"
    levels = measure(fake_argv, model_dir=model_dir, served_name=FAKE_NAME, settings=settings,
                     log_path=tmp_path / "logs" / "measure.log",
                     env={"FAKE_OPENAI_PORT_TAKEN_ONCE": str(taken)})
    assert taken.exists()
    assert [level.concurrency for level in levels] == list(settings.concurrency)


def test_more_concurrency_than_requests_sends_one_request_per_worker(
    fake_argv: list[str], model_dir: Path, tmp_path: Path
) -> None:
    settings = SmokeSettings(prompts=["one two three"], max_tokens=2, concurrency=[6],
                             requests=2, ready_timeout_s=60)
    report = run(fake_argv, model_dir, settings, tmp_path, price_per_hour=None)

    assert report.passed, report.failure
    (level,) = report.load
    assert (level.concurrency, level.requests, level.output_tokens) == (6, 6, 12)
    assert report.cost_per_million_tokens is None


def test_healthy_but_failing_generation_is_never_ready(
    fake_argv: list[str], model_dir: Path, settings: SmokeSettings, tmp_path: Path
) -> None:
    report = run(fake_argv, model_dir, settings, tmp_path,
                 env={"FAKE_OPENAI_FAIL_GENERATION": "1"})

    assert not report.passed
    assert report.ready_s is None
    assert report.load == []
    assert [check.name for check in report.checks] == ["ready"]
    assert report.failure is not None
    assert report.failure.startswith("ready: the server answers but cannot generate: HTTP 500")
    assert "FAKE_OPENAI_FAIL_GENERATION" in report.failure
    assert "/health says HTTP 200" in report.failure
    assert "\n" not in report.failure
    assert report.best_output_tokens_per_s is None
    assert report.cost_per_million_tokens is None


def test_silent_truncation_fails_the_long_prompt_check(
    fake_argv: list[str], model_dir: Path, settings: SmokeSettings, tmp_path: Path
) -> None:
    report = run(fake_argv, model_dir, settings, tmp_path, env={"FAKE_OPENAI_TRUNCATE": "100"})

    assert not report.passed
    assert failed_names(report) == ["long_prompt"]
    check = report.check("long_prompt")
    assert check is not None
    assert check.evidence["expected"] == 232
    assert check.evidence["reported"] == 100
    assert check.evidence["counted_by"] == "/tokenize"
    assert report.failure == ("long_prompt: sent 232 prompt tokens (by /tokenize), the server "
                              "counted 100: truncated")
    assert report.load == []  # no load on a server that failed a check


def test_without_tokenize_the_long_prompt_is_counted_from_usage(
    fake_argv: list[str], model_dir: Path, settings: SmokeSettings, tmp_path: Path
) -> None:
    report = run(fake_argv, model_dir, settings, tmp_path, env={"FAKE_OPENAI_NO_TOKENIZE": "1"})

    assert report.passed, report.failure
    check = report.check("long_prompt")
    assert check is not None
    assert check.evidence["counted_by"] == "usage.prompt_tokens, extrapolated"
    assert check.evidence["expected"] == check.evidence["reported"] == 232

    truncated = run(fake_argv, model_dir, settings, tmp_path,
                    env={"FAKE_OPENAI_NO_TOKENIZE": "1", "FAKE_OPENAI_TRUNCATE": "100"})
    assert truncated.failure == ("long_prompt: sent 232 prompt tokens (by usage.prompt_tokens, "
                                 "extrapolated), the server counted 100: truncated")


def test_a_strict_server_is_smoked_without_the_extra_fields(
    fake_argv: list[str], model_dir: Path, settings: SmokeSettings, tmp_path: Path
) -> None:
    report = run(fake_argv, model_dir, settings, tmp_path, env={"FAKE_OPENAI_STRICT": "1"})

    assert report.passed, report.failure
    greedy = report.check("greedy")
    assert greedy is not None
    assert greedy.evidence["ignore_eos"] == "refused by the server; not sent"
    stream = report.check("stream")
    assert stream is not None
    assert stream.evidence["completion_tokens"] is None  # no usage without stream_options
    assert stream.evidence["chunks"] == 4
    assert [level.output_tokens for level in report.load] == [20, 20]  # counted by chunk


def test_a_prompt_beyond_the_server_limit_is_refused_with_its_error(
    fake_argv: list[str], model_dir: Path, settings: SmokeSettings, tmp_path: Path
) -> None:
    report = run(fake_argv, model_dir, settings, tmp_path, max_input_len=600)  # server: 512

    assert failed_names(report) == ["long_prompt"]
    assert report.failure is not None
    assert report.failure.startswith("long_prompt: a 592-token prompt was refused: HTTP 400")
    assert "maximum context length is 512" in report.failure


def test_a_server_that_exits_fails_at_once_with_its_log(
    fake_argv: list[str], settings: SmokeSettings, tmp_path: Path
) -> None:
    report = run(fake_argv, tmp_path / "missing", settings, tmp_path)

    assert not report.passed
    assert report.failure is not None
    assert report.failure.startswith("ready: the server exited with code 1 before it was ready")
    ready = report.check("ready")
    assert ready is not None
    assert "does not exist" in ready.evidence["log_tail"]


def test_a_server_that_never_listens_times_out(
    model_dir: Path, tmp_path: Path
) -> None:
    settings = SmokeSettings(ready_timeout_s=1)
    argv = [sys.executable, "-c", "import time; time.sleep(600)", "{model_dir}", "{port}"]
    report = run(argv, model_dir, settings, tmp_path)

    assert report.failure is not None
    assert report.failure.startswith("ready: not ready after 1 s (last probe: "
                                     "ConnectionRefusedError")
    assert report.argv[:4] == [*argv[:3], str(model_dir)]  # what was run, filled in
    assert report.argv[4].isdigit()


def test_a_missing_program_is_reported(model_dir: Path, settings: SmokeSettings,
                                       tmp_path: Path) -> None:
    report = run([str(tmp_path / "no-such-server"), "--port", "{port}"], model_dir, settings,
                 tmp_path)

    assert report.failure is not None
    assert report.failure.startswith(f"ready: cannot start {tmp_path / 'no-such-server'}")
    assert report.argv[:2] == [str(tmp_path / "no-such-server"), "--port"]
    ready = report.check("ready")
    assert ready is not None
    assert ready.evidence == {"argv": report.argv}  # never started: no log to show


def test_a_wrong_served_name_is_never_ready(
    fake_argv: list[str], model_dir: Path, settings: SmokeSettings, tmp_path: Path
) -> None:
    report = run(fake_argv, model_dir, settings, tmp_path, served_name="other")

    assert report.failure is not None
    assert report.failure.startswith("ready: the server answers but cannot generate: HTTP 404")
    assert "`other` does not exist" in report.failure


def test_reference_outputs_exact_and_by_agreement(
    fake_argv: list[str], model_dir: Path, settings: SmokeSettings, tmp_path: Path
) -> None:
    prompts = settings.prompts
    exact = [(p, "".join(Fake.generate(p, settings.max_tokens))) for p in prompts]
    half = [(p, "".join([*Fake.generate(p, 2), " zulu", " zulu"])) for p in prompts]

    passing = run(fake_argv, model_dir, settings, tmp_path, reference=exact)
    assert passing.passed, passing.failure
    check = passing.check("reference")
    assert check is not None
    assert [row["agreement"] for row in check.evidence["outputs"]] == [1.0, 1.0]

    wrong = run(fake_argv, model_dir, settings, tmp_path, reference=half)
    assert failed_names(wrong) == ["reference"]
    assert wrong.failure is not None
    assert wrong.failure.startswith(f"reference: {prompts[0]!r} gave ")
    assert wrong.failure.endswith("(exactly)")

    lenient = run(fake_argv, model_dir, settings, tmp_path, reference=half, threshold=0.5)
    assert lenient.passed, lenient.failure
    check = lenient.check("reference")
    assert check is not None
    assert [row["agreement"] for row in check.evidence["outputs"]] == [0.5, 0.5]

    strict = run(fake_argv, model_dir, settings, tmp_path, reference=half, threshold=0.75)
    assert failed_names(strict) == ["reference"]


def test_render_argv_fills_both_placeholders_anywhere(tmp_path: Path) -> None:
    template = ["serve", "{model_dir}", "--port", "{port}", "--url=http://h:{port}/x",
                "--tokenizer", "{model_dir}/tok", "{other}"]
    assert render_argv(template, model_dir=tmp_path, port=8123) == [
        "serve", str(tmp_path), "--port", "8123", "--url=http://h:8123/x",
        "--tokenizer", f"{tmp_path}/tok", "{other}"]
    assert template[1] == "{model_dir}"  # the template is left alone


def test_free_port_is_a_bindable_loopback_port() -> None:
    port = free_port()
    assert 0 < port < 65536
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", port))


def test_ctrl_c_while_a_server_starts_stops_it(
    model_dir: Path, settings: SmokeSettings, tmp_path: Path
) -> None:
    """A server that never answers; Ctrl-C (here SIGALRM's KeyboardInterrupt) while smoke
    waits for it to generate stops it then, not when the process exits."""
    import signal

    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    tag = uuid.uuid4().hex
    silent = [sys.executable, "-c", "import time; time.sleep(120)", "{model_dir}", "{port}"]
    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 1.0)
    try:
        smoke(SmokeServer(silent, model_dir, FAKE_NAME, tmp_path / "smoke.log", env={TAG: tag}),
              settings=settings, max_input_len=240, price_per_hour=None)
    except KeyboardInterrupt:
        pass
    else:
        raise AssertionError("smoke returned before it was interrupted")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert tagged_processes(tag) == [], "the server outlived the interrupt"
