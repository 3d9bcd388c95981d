"""The smoke of a weight-stripped engine: it serves what a node will serve.

The builder refits the engine from its checkpoint (`trtllm-refit`, `pipeline.stages.refit`)
into the smoke run's `refit/` directory and smokes that with the usual verdict. A refit that
fails is the engine's failure (a failing `refit` check, quarantined), unless the program is
missing here (the machine's: the engine waits for a smoke elsewhere).

Then the refit must be shown to be the engine a whole build makes: the first stripped engine
of a (model, quant, TensorRT-LLM version) on a GPU SKU is built again without --strip_plan,
on this node in this run, smoked alike, and the two compared (`judge`): identical greedy
outputs on the smoke prompts, and speed no worse by the promotion gate's rule
(`pipeline.serving.abgate.decide`, over each smoke's load as one round each; when that finds
the refit slower, `nightly.gate_rounds` more rounds each, interleaved, decide over them all).
The comparison is published as `refit-equivalence` evidence (`registry.sql.refit_evidence`);
without evidence that holds, a stripped engine that passed its smoke stays `built`.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.host.runner import log_tail, run_process
from pipeline.host.runtimes import program
from pipeline.serving.abgate import decide, levels_of
from pipeline.serving.checks import Check
from pipeline.serving.smoke import SmokeReport, measure
from pipeline.serving.verdict import SmokeJob, answers_to, run_smoke
from pipeline.stages.refit import REFIT_DIR, RefitError, is_stripped, refit, whole_argv
from registry.sql.refit_evidence import equivalence_for
from registry.sql.refit_verdict import KIND, held_back
from registry.tokenizer import TOKENIZER_DIR

if TYPE_CHECKING:
    from pipeline.planning.plan import Plan
    from pipeline.planning.stage_run import StageRun
    from pipeline.serving.loadgen import LoadLevel
    from registry.context import Context



@dataclass(frozen=True)
class Verdict:
    """What the comparison of a whole and a refitted engine found."""

    passed: bool
    reason: str
    details: dict[str, Any]


def judge(whole: SmokeReport, refitted: SmokeReport, max_regression: float,
          more: tuple[list[list[LoadLevel]], list[list[LoadLevel]]] | None = None) -> Verdict:
    """Identical greedy outputs, then the gate's rule on speed (the module doc). Pure."""
    outputs = [_greedy(whole), _greedy(refitted)]
    details: dict[str, Any] = {"whole_outputs": outputs[0], "refitted_outputs": outputs[1]}
    if not whole.passed:
        return Verdict(False, f"the whole engine did not pass its smoke: {whole.failure}",
                       details)
    if outputs[0] != outputs[1]:
        prompt = next((a["prompt"] for a, b in zip(outputs[0], outputs[1], strict=False)
                       if a != b), None)
        return Verdict(False, "the refitted engine's greedy output differs from the whole "
                       f"engine's for {prompt!r}", details)
    rounds = ([whole.load, *(more[0] if more else [])],
              [refitted.load, *(more[1] if more else [])])
    gate = decide(rounds[0], rounds[1], max_regression)
    details["levels"] = levels_of(gate)
    if not gate.passed:
        return Verdict(False, f"refitted slower than whole: {gate.reason}", details)
    return Verdict(True, f"identical greedy outputs on {len(outputs[0])} prompts; "
                   f"{gate.reason}", details)


def _greedy(report: SmokeReport) -> list[dict[str, Any]]:
    check = report.check("greedy")
    outputs = (check.evidence or {}).get("outputs") if check is not None else None
    return [{"prompt": o.get("prompt"), "text": o.get("text")} for o in outputs or []]


@dataclass(frozen=True)
class StrippedSmoke:
    """The smoke run *run* of the stripped engine built by *build*."""

    plan: Plan
    run: StageRun
    build: StageRun
    input_dir: Callable[[str], Path]  # a key's local directory (this process's, or fetched)

    @property
    def refit_dir(self) -> Path:
        return self.run.workdir / REFIT_DIR

    def dirs(self, key: str) -> Path:
        """What the smoke's argv serves: the refitted engine in place of the plan."""
        return self.refit_dir if key == self.build.key else self.input_dir(key)

    def unavailable(self) -> str | None:
        return "trtllm-refit is not on PATH" if program("trtllm-refit") is None else None

    def refit(self, log: Path) -> SmokeReport | None:
        """Refit into `refit/`; None when it worked, else the failing report."""
        target = self.plan.target(self.run.targets[0])
        try:
            seconds = refit(self.input_dir(self.build.key), self.input_dir(self.build.inputs[0]),
                            self.refit_dir, log_path=log, key=self.run.key,
                            timeout_s=self.plan.loaded.recipe.build.timeout_s)
        except RefitError as exc:
            message = str(exc)
            return SmokeReport(False, [Check("ready", False, message, {
                "cause": message, "log_tail": exc.log_tail})], [], None, None, None, None,
                log, [], f"refit: {message}")
        with log.open("a", encoding="utf-8") as out:
            out.write(f"\nenginectl: refitted {target.id} in {seconds:.1f} s\n")
        return None

    def equivalence(self, ctx: Context, entry: str, refitted: SmokeReport, *, job: SmokeJob,
                    force: bool = False,
                    slot: AbstractContextManager[None] | None = None) -> str | None:
        """Find, or make here, the refit-equivalence evidence of this engine's tuple; why
        the engine stays `built`, or None when it may be `ready`. Under *slot* (this
        machine's GPU, which the local executor's builds hold one at a time), so that two
        smokes of one tuple do not both compare."""
        with slot or contextlib.nullcontext():
            return self._equivalence(ctx, entry, refitted, job=job, force=force)

    def _equivalence(self, ctx: Context, entry: str, refitted: SmokeReport, *,
                     job: SmokeJob, force: bool) -> str | None:
        target = self.plan.target(self.run.targets[0])
        toolchain = dict(self.run.toolchain)
        tuple_of = {"model": self.plan.loaded.recipe.model.name, "quant": target.quant,
                    "gpu": target.gpu.sku, "trtllm": toolchain.get("trtllm")}
        with ctx.registry.session(readonly=True) as session:
            found = equivalence_for(session, **tuple_of)
        if found is not None and not force:
            return held_back(found, **tuple_of)
        verdict, log = self._compare(refitted, job)
        folder = self.run.workdir / "equivalence"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "refit-equivalence.json").write_text(json.dumps({
            **tuple_of, "passed": verdict.passed, "reason": verdict.reason,
            "stripped_engine": entry, **verdict.details}, indent=2, sort_keys=True, default=str))
        shutil.copy2(log, folder / "whole.log")
        from registry.ops.publish import publish

        published = publish(
            ctx, folder, kind=KIND, labels={"model": tuple_of["model"], "quant": target.quant,
                                            "gpu": target.gpu.sku},
            status="ready" if verdict.passed else "quarantined",
            status_reason=None if verdict.passed else verdict.reason, toolchain=toolchain,
            inputs=(entry,), recipe_digest=self.plan.loaded.digest)
        with ctx.registry.session(readonly=True) as session:
            from registry.sql import records

            record = records.get_artifact(session, published.digest)
        return held_back(record, **tuple_of)

    def _compare(self, refitted: SmokeReport, job: SmokeJob) -> tuple[Verdict, Path]:
        """Build the engine whole here, smoke it, compare; the verdict and the build's log."""
        recipe = self.plan.loaded.recipe
        whole, log = self.run.workdir / "whole", self.run.workdir / "whole-build.log"
        shutil.rmtree(whole, ignore_errors=True)
        whole.mkdir(parents=True)
        argv = self.build.make_argv(self.input_dir, whole / "out")
        if argv is None:  # pragma: no cover - an engine build always has one
            raise RuntimeError("no trtllm-build argv")
        cache = ["--output_timing_cache", str(whole / "model.cache")]  # not the cwd's
        result = run_process([*whole_argv(argv), *cache], log_path=log,
                             timeout_s=recipe.build.timeout_s)
        if not result.ok:
            return Verdict(False, f"the whole build failed: {log_tail(log)[-300:]}", {}), log
        if (carried := self.input_dir(self.build.key) / TOKENIZER_DIR).is_dir():
            shutil.copytree(carried, whole / "out" / TOKENIZER_DIR, dirs_exist_ok=True)
        served = self.run.make_argv(
            lambda key: whole / "out" if key == self.build.key else self.input_dir(key),
            self.run.workdir / "out")
        if served is None:  # pragma: no cover - a smoke run always has one
            raise RuntimeError("no server argv")
        report = run_smoke(replace(job, argv=served, gpus=1,
                                   log_path=self.run.workdir / "whole-smoke.log"))
        threshold = recipe.nightly.max_regression
        verdict = judge(report, refitted, threshold)
        if verdict.passed or not report.passed or "greedy output" in verdict.reason:
            return verdict, log
        extra: tuple[list[list[LoadLevel]], list[list[LoadLevel]]] = ([], [])
        mine = self.run.make_argv(self.dirs, self.run.workdir / "out") or []
        for index in range(recipe.nightly.gate_rounds):  # interleaved, as the gate does
            for side, argv_of in ((0, served), (1, mine)):
                extra[side].append(measure(
                    argv_of, model_dir=job.model_dir, settings=job.smoke,
                    served_name=answers_to(argv_of, job.model_dir, job.served_name),
                    log_path=self.run.workdir / f"{('whole', 'refit')[side]}-{index + 1}.log"))
        return judge(report, refitted, threshold, extra), log


def stripped_smoke(plan: Plan, run: StageRun, input_dir: Callable[[str], Path]
                   ) -> StrippedSmoke | None:
    """*run*'s StrippedSmoke when it smokes a weight-stripped engine, else None."""
    build = plan.stages.get(run.inputs[0]) if run.stage == "smoke" else None
    if build is None or build.kind != "trtllm-engine" or not is_stripped(build.params["flags"]):
        return None
    return StrippedSmoke(plan, run, build, input_dir)
