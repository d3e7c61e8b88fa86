"""Detectors over what ran: calls, acceptance and fingerprints.

>>> check_acceptance([Acceptance(step=i, accept_lengths=[1], draft_tokens=4) for i in range(8)])
[Finding(code='acceptance_collapse', ...)]
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

from ..records import Acceptance, Call, Finding, Fingerprint, TensorStats
from ..rules.acceptance import COLLAPSE_MEAN, COLLAPSE_WINDOW, batch_emptying, mean_accept_length
from ..rules.catalogue import finding
from ..rules.globs import glob_match
from ..rules.roles import DRAFT_FC, DRAFT_LAYER
from .acceptance_sampling import judge_low_window, tally

# The draft's fc and decoder layer by name, for traces written before roles (``Call.role``:
# DRAFT_FC, DRAFT_LAYER) existed.
DRAFT_LAYER_GLOBS = ("**.midlayer", "**.fc_draft_layer")
FC_GLOB = "**.fc"
# Chunks whose scale moved more than this factor (or whose mean moved by more than this
# many reference stds) no longer look like the layer the draft was trained on.
SKEW_STD_FACTOR = 2.0
SKEW_MEAN_STDS = 1.0
# Within ONE fused input (no training reference), chunks come from different layers and
# their scales differ anyway; an embedding-output chunk differs from a deep residual
# stream by 10-100x. So a chunk is flagged only this far from the others' median.
CHUNK_SCALE_OUTLIER = 8.0


def check_nonfinite(calls: Iterable[Call]) -> list[Finding]:
    first: dict[str, tuple[Call, str, TensorStats]] = {}
    counts: dict[str, int] = defaultdict(int)
    for call in calls:
        for meta in [*call.inputs, *call.outputs]:
            s = meta.stats
            if s is not None and ((s.nan or 0) > 0 or (s.inf or 0) > 0):
                counts[call.module] += 1
                first.setdefault(call.module, (call, meta.arg, s))
    findings = []
    ordered = sorted(first.items(), key=lambda kv: kv[1][0].seq)
    if not ordered:
        return []
    # The earliest call with a non-finite value is where it entered: every later module
    # may only have inherited it.
    origin, (origin_call, origin_arg, _) = ordered[0]
    where = "input" if any(m.arg == origin_arg for m in origin_call.inputs) else "output"
    fix = f"start at {origin} (its {origin_arg}, the first non-finite {where} traced, step {origin_call.step}): " + (
        "the value came in from the caller, so check what feeds it"
        if where == "input"
        else "check its weights for NaN/Inf and its dtype's range (an fp16 overflow), then its inputs"
    )
    for module, (call, arg, s) in ordered:
        findings.append(
            finding(
                "nonfinite",
                f"{module} {arg} holds {s.nan} NaN and {s.inf} Inf of {s.numel} values (first at step {call.step})",
                module=module,
                evidence={"arg": arg, "nan": s.nan, "inf": s.inf, "numel": s.numel, "calls_affected": counts[module]},
                fix=fix,
                step=call.step,
                source="checks.calls",
            )
        )
    return findings


def _is_draft_layer(module: str) -> bool:
    # Names only (a trace without roles): the decoder layer itself, not its submodules
    # (hidden_norm, self_attn, ...).
    return any(glob_match(module, g) for g in DRAFT_LAYER_GLOBS) or (module.endswith(".layers.0") and "draft" in module.lower())


def check_fc_called(calls: Iterable[Call]) -> list[Finding]:
    """The draft's decoder layer ran and its fc never ran once: fc was bypassed.

    EAGLE-3 drafts several tokens per verify: the first draft forward takes the target's
    fused states through fc, the later ones feed the draft's own hidden-width state back
    and skip fc by design. So a draft step without fc is normal; a trace in which the
    decoder layer ran and fc never did is the bypass (the target handed over states that
    already had the hidden width). The draft's fc and layer are known by their roles
    (``Call.role``); when no call carries one (a trace written before roles existed) they
    are told by their names.
    """
    calls = list(calls)
    roled = any(call.role for call in calls)
    layer_steps: dict[int, Call] = {}
    fc_ran = False
    for call in calls:
        if (call.role == DRAFT_FC) if roled else glob_match(call.module, FC_GLOB):
            fc_ran = True
            break
        if (call.role == DRAFT_LAYER) if roled else _is_draft_layer(call.module):
            layer_steps.setdefault(call.step, call)
    if fc_ran or not layer_steps:
        return []
    steps = sorted(layer_steps)
    layer = layer_steps[steps[0]]
    # Engines pass (positions, embeds, hidden_states): the hidden states come last.
    widths = [m.shape[-1] for m in layer.inputs if len(m.shape) >= 2]
    width = widths[-1] if widths else None
    return [
        finding(
            "fc_bypass",
            f"the draft's decoder layer ran in {len(steps)} step{'s' if len(steps) != 1 else ''} and its fc never ran: the incoming hidden "
            "states already had the embedding width, so fc was skipped",
            module=layer.module,
            evidence={"steps_bypassed": len(steps), "first_step": steps[0], "decoder_input_width": width},
            fix=(f"the decoder layer got {width}-wide states, the hidden width: " if width else "")
            + "make the target capture the aux layers the draft was trained on (--speculative-algorithm EAGLE3, "
            "eagle_config.use_aux_hidden_state=true, one id per aux layer in eagle_config.eagle_aux_hidden_state_layer_ids)",
            step=steps[0],
            source="checks.calls",
        )
    ]


def check_acceptance(
    records: Iterable[Acceptance],
    window: int = COLLAPSE_WINDOW,
    floor: float = COLLAPSE_MEAN,
    *,
    run_mean: tuple[float, int] | None = None,
    run_peak: int = 0,
) -> list[Finding]:
    """``acceptance_collapse`` for the first ``window`` verify steps in a row whose mean accept
    length is at most ``floor``. ``records`` is the whole run, or (live) only the latest
    steps: then ``run_mean`` is the run's (mean, steps) so far, as the finding quotes it.

    Where the records carry the requests' sampling, only greedy requests judge the draft:
    a low window of sampled requests beside healthy greedy ones, or of sampled requests
    alone, is ``acceptance_sampled`` (checks/acceptance_sampling.py), never a collapse.
    The window where the running batch empties (the load's clients stopping) is not judged;
    ``run_peak`` is the run's largest batch before ``records`` (live: the steps already gone)."""
    steps = [r for r in records if r.accept_lengths]
    if len(steps) < window:
        return []
    means = [mean_accept_length(r.accept_lengths) for r in steps]
    batches = [len(r.accept_lengths) for r in steps]
    for start in range(0, len(means) - window + 1):
        chunk = means[start : start + window]
        mean = sum(chunk) / window
        if mean <= floor and not batch_emptying(batches[start : start + window], max([run_peak, *batches[:start]])):
            shown = steps[start : start + window]
            counts = tally(shown)
            k = steps[0].draft_tokens
            instead = judge_low_window(
                counts, window_mean=mean, draft_tokens=k, first_step=shown[0].step, last_step=shown[-1].step, floor=floor
            )
            if instead is not None:
                return instead
            overall, counted = run_mean if run_mean is not None else (sum(means) / len(means), len(means))
            evidence: dict[str, object] = {
                "window_mean": round(mean, 3),
                "run_mean": round(overall, 3),
                "run_steps": counted,
                "window": window,
                "draft_tokens": k,
            }
            greedy = counts.greedy_mean if counts.sampled_n else None
            if greedy is not None:
                # Sampled requests in the window too: the collapse is the greedy requests' own.
                evidence["greedy_mean"] = round(greedy, 3)
                evidence["sampled_mean"] = round(counts.sampled_mean or 0.0, 3)
            also = f"; its greedy requests alone accept {greedy:.2f}" if greedy is not None else ""
            return [
                finding(
                    "acceptance_collapse",
                    f"mean accept length {mean:.2f} over {window} verify steps from step {steps[start].step} "
                    f"({overall:.2f} over the run's {counted} steps{' so far' if run_mean is not None else ''}, k={k}; a draft that never "
                    f"misses reaches {k + 1:g}{also})",
                    evidence=evidence,
                    step=steps[start].step,
                    source="checks.calls",
                )
            ]
    return []


def chunk_skew(seen: TensorStats, ref: TensorStats) -> str | None:
    """Why a chunk no longer looks like its reference, or None."""
    seen_std, ref_std, seen_mean, ref_mean = seen.std, ref.std, seen.mean, ref.mean
    if seen_std is None or seen_mean is None or ref_mean is None or not ref_std:
        return None
    ratio = seen_std / ref_std
    if ratio > SKEW_STD_FACTOR or ratio < 1 / SKEW_STD_FACTOR:
        return f"std {seen_std:.3g} vs {ref_std:.3g} in training ({ratio:.2f}x)"
    if abs(seen_mean - ref_mean) > SKEW_MEAN_STDS * ref_std:
        return f"mean {seen_mean:.3g} vs {ref_mean:.3g} in training"
    return None


def check_feature_skew(seen: Fingerprint, reference: Fingerprint) -> list[Finding]:
    if seen.chunk_width != reference.chunk_width or len(seen.chunks) != len(reference.chunks):
        return [
            finding(
                "shape_mismatch",
                f"fused draft input has {len(seen.chunks)} chunks of {seen.chunk_width}, "
                f"training had {len(reference.chunks)} of {reference.chunk_width}",
                module=seen.module,
                evidence={"seen_chunks": len(seen.chunks), "reference_chunks": len(reference.chunks)},
                fix=f"make the target capture the {len(reference.chunks)} layers the fingerprint was taken on"
                + (f" (boundaries {list(reference.boundaries)})" if reference.boundaries else "")
                + f", each {reference.chunk_width} wide",
                source="checks.calls",
            )
        ]
    skewed = {}
    for index, (s, r) in enumerate(zip(seen.chunks, reference.chunks)):
        reason = chunk_skew(s, r)
        if reason:
            skewed[index] = reason
    if not skewed:
        return []
    detail = "; ".join(f"chunk {i}: {why}" for i, why in skewed.items())
    return [
        finding(
            "feature_skew",
            f"{len(skewed)} of {len(seen.chunks)} chunks of the fused draft input do not match the training fingerprint ({detail})",
            module=seen.module,
            evidence={
                "chunks": {str(i): why for i, why in skewed.items()},
                "seen_boundaries": seen.boundaries,
                "reference_boundaries": reference.boundaries,
            },
            fix=_skew_fix(seen.boundaries, reference.boundaries, sorted(skewed)),
            source="checks.calls",
        )
    ]


def _skew_fix(seen: Sequence[int] | None, reference: Sequence[int] | None, chunks: list[int]) -> str:
    """Which boundaries feed the skewed chunks against the ones the fingerprint was taken on."""
    named = ", ".join(map(str, chunks))
    if seen is not None and reference is not None and list(seen) != list(reference):
        return (
            f"the target captures boundaries {list(seen)}, the fingerprint was taken on {list(reference)}: write the "
            f"layer ids so the target captures {list(reference)} (aux_layers_mismatch gives the ids under the engine's rule)"
        )
    return (
        f"the same boundaries feed chunk {named} as in training, but not the same values: check that the capture "
        "stores the raw residual stream (hidden_states + residual), with no norm or scale before the concat"
    )


def chunk_scale_outliers(stds: Sequence[float | None]) -> dict[int, str]:
    """Chunks of one fused draft input whose std is far from the other chunks' median
    (same width, another kind of layer: the layer-capture bug without a reference)."""
    flags: dict[int, str] = {}
    for i, std in enumerate(stds):
        others = sorted(s for j, s in enumerate(stds) if j != i and s)
        if not std or not others:
            continue
        ratio = std / others[len(others) // 2]
        if ratio > CHUNK_SCALE_OUTLIER:
            flags[i] = f"std {ratio:.3g}x above the other chunks"
        elif ratio < 1 / CHUNK_SCALE_OUTLIER:
            flags[i] = f"std {1 / ratio:.3g}x below the other chunks"
    return flags
