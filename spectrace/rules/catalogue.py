"""The catalogue of finding codes: one place that says what each code means.

Detectors, the audit and the SGLang integration all build findings through
:func:`finding`, so a code always carries its severity, a cause and a fix.

    >>> finding("fc_bypass", "draft got 64-wide states, fc expects 192", module="model.fc",
    ...         evidence={"seen_width": 64, "fc_in_features": 192}).severity
    'error'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..records import Finding, Severity


@dataclass(frozen=True)
class Code:
    code: str
    severity: Severity
    meaning: str
    fix: str


CATALOGUE: dict[str, Code] = {
    c.code: c
    for c in [
        Code(
            "fc_bypass",
            "error",
            "the draft received hidden states whose width is not fc.in_features, so fc was skipped",
            "make the target capture the aux layers (EAGLE3 algorithm, eagle_config.use_aux_hidden_state=true, "
            "eagle_aux_hidden_state_layer_ids inside eagle_config)",
        ),
        Code(
            "weights_dropped",
            "error",
            "checkpoint tensors that no parameter consumed",
            "rename the checkpoint keys to the engine's names (e.g. layers.0.* <-> midlayer.*) or add a name map",
        ),
        Code(
            "weights_missing",
            "error",
            "parameters that no checkpoint tensor wrote; they stay at random init",
            "add the missing tensors to the checkpoint, or configure the engine to take them from the target",
        ),
        Code(
            "aux_layers_mismatch",
            "error",
            "the target captures other layers than the draft was trained on",
            "write the layer ids in the convention the engine applies so the captured boundaries equal the trained ones",
        ),
        Code(
            "aux_capture_disabled",
            "error",
            "an EAGLE-3 draft, but the target captures no aux hidden states",
            "launch with --speculative-algorithm EAGLE3 and set eagle_config.use_aux_hidden_state=true",
        ),
        Code(
            "algorithm_mismatch",
            "error",
            "the draft architecture and the speculative algorithm disagree",
            "use --speculative-algorithm EAGLE3 for an EAGLE-3 draft (LlamaForCausalLMEagle3)",
        ),
        Code(
            "unsupported_config_flag",
            "error",
            "the draft config sets a flag the engine ignores",
            "retrain without the flag, or serve with an engine that implements it",
        ),
        Code(
            "shape_mismatch",
            "error",
            "a static width contract between target and draft is broken",
            "make fc.in_features equal num_aux x target hidden size",
        ),
        Code(
            "feature_skew",
            "error",
            "per-chunk statistics of the fused draft input differ from the training fingerprint",
            "check which target layers feed each chunk (layer ids and their convention)",
        ),
        Code(
            "chunk_provenance",
            "error",
            "chunks of the fused draft input are other boundaries of the target than its capture record says: in the same "
            "step, each chunk's statistics equal those of the residual stream at another boundary",
            "find what changed the capture (a patched or other engine release, layers_to_capture set after load, the aux "
            "states concatenated in another order), then write the layer ids so the boundaries really captured equal the "
            "ones the draft was trained on",
        ),
        Code(
            "chunk_unmatched",
            "error",
            "a chunk of the fused draft input equals no boundary of the target's residual stream traced in the same step: "
            "it is not a captured hidden state as the engine stores it (a normed or scaled state, a layer's partial output, "
            "rows of another step)",
            "find what writes the aux hidden states: the draft expects the raw residual stream (hidden_states + residual) at "
            "its trained boundaries, over the step's own rows; check a stale buffer under CUDA-graph replay and any norm or "
            "scale applied before the concat",
        ),
        Code(
            "values_boundary_mismatch",
            "error",
            "by value, chunks of the served fused draft input are other hidden states of the target than the draft was "
            "trained on: recomputed for the same token ids, each chunk equals another boundary (spectrace compare-train)",
            "write eagle_aux_hidden_state_layer_ids so the engine captures the boundaries the draft was trained on",
        ),
        Code(
            "values_chunk_unmatched",
            "error",
            "a chunk of the served fused draft input equals no hidden state of the target recomputed for the same token "
            "ids (spectrace compare-train): another target, other weights or dtype, or rows of other tokens",
            "compare against the exact target the server loads (same folder, same revision); if it is, find what writes "
            "the aux hidden states (a norm or scale before the concat, a stale buffer under CUDA-graph replay)",
        ),
        Code(
            "acceptance_collapse",
            # A symptom, not a cause: the error findings beside it say why; alone, it points
            # at the draft's training rather than at the wiring spectrace can check.
            "warning",
            "accept length stays near 1 over a window of verify steps",
            "look at the error findings: acceptance collapses when the draft's inputs or weights are wrong; "
            "with none, check the draft's training and that it was trained for this target",
        ),
        Code(
            "nonfinite",
            "error",
            "NaN or Inf in a traced tensor",
            "find the first module whose output is non-finite and check its inputs and dtype",
        ),
        Code(
            "short_capture",
            "error",
            "the target captured fewer aux hidden states than ids were asked for",
            "use layer ids below the target's layer count; the engine drops the others without a word",
        ),
        Code(
            "capture_unsupported",
            "error",
            "this SGLang release cannot capture the layers the target is asked for (the embedding output on a "
            "Llama target before 0.5.22, fewer layers than ids on DeepSeek): it fails at the first forward, "
            "on a server at CUDA-graph capture, and says nothing else",
            "serve with a release whose target captures these layers, or retrain the draft on layers this "
            "release can capture; rewriting the ids alone does not help, the draft was trained on those chunks",
        ),
        Code(
            "logits_fallback",
            "error",
            "the logits processor stored the final hidden state because no aux states were captured",
            "enable aux capture on the target (EAGLE3 algorithm, use_aux_hidden_state)",
        ),
    ]
}


def finding(
    code: str,
    message: str,
    *,
    module: str | None = None,
    evidence: dict[str, Any] | None = None,
    fix: str | None = None,
    severity: Severity | None = None,
    step: int | None = None,
    source: str = "",
) -> Finding:
    """Build a :class:`Finding` for a catalogued code (the fix defaults to the catalogue's)."""
    entry = CATALOGUE[code]
    return Finding(
        code=code,
        severity=severity or entry.severity,
        message=message,
        module=module,
        evidence=evidence or {},
        fix=fix or entry.fix,
        step=step,
        source=source,
    )
