"""`advise`: read a model's proofs and pools' fingerprints from the registry, then decide
(`pipeline.advise.decide`). Reads only: nothing is created or changed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from pipeline.advise.decide import RUNTIME_OF, Advice, decide
from pipeline.serving.capacity import Slo

if TYPE_CHECKING:
    from registry.context import Context


def advise(
    ctx: Context, model: str, *, slo: Slo, rate: float, gpu: str | None = None,
    prices: Mapping[str, float] | None = None,
) -> Advice:
    """The advice for serving *rate* requests/s of *model* within *slo* (on *gpu* only, when
    given; *prices*: $ per GPU-hour by SKU over the prices the proofs recorded).

    `UnknownModelError` (exit 6) for a model the registry has no artifact of;
    `NothingProvenError` (exit 6) when no artifact has a curve proven on its pool's current
    fingerprint."""
    from pipeline.errors import NothingProvenError
    from registry.errors import UnknownModelError
    from registry.sql.curve_records import current_fingerprints, curve_proofs

    with ctx.registry.session(readonly=True) as session:
        proofs = curve_proofs(session, model, tuple(RUNTIME_OF))
        fingerprints = current_fingerprints(session)
    if not proofs:
        from registry.sql.resolving import known_models

        with ctx.reader.reading() as reader:
            if model not in (known := known_models(reader)):
                raise UnknownModelError(model, known)
    advice = decide(model, proofs, fingerprints, slo=slo, rate=rate, prices=prices or {},
                    gpu=gpu)
    if not advice.ranked and not advice.short:
        raise NothingProvenError(model, [
            f"{u.digest[:19]}… {u.kind}{f' on {u.gpu}' if u.gpu else ''}: {u.reason}"
            for u in advice.unproven] or ["no artifact of it has passed a smoke"])
    return advice
