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
    # What makes it an error (and what only a warning): the evidence the checks require.
    evidence: str = ""


CATALOGUE: dict[str, Code] = {
    c.code: c
    for c in [
        Code(
            "fc_bypass",
            "error",
            "the draft fuses its input through fc only when it is num_aux x hidden wide; with fewer aux states the engine "
            "skips fc (SGLang: an input as wide as the embedding) or never builds it (vLLM), and raises nothing",
            "make the target capture the aux layers (EAGLE3 algorithm, eagle_config.use_aux_hidden_state=true, "
            "eagle_aux_hidden_state_layer_ids inside eagle_config)",
            evidence=(
                "an error when the draft provably gets a narrower input than its fc takes: seen at runtime, or "
                "eagle_config.use_aux_hidden_state false beside a checkpoint that holds a trained fc. A last-state "
                "draft (use_aux_hidden_state false, no fc in the checkpoint, a trainer that trains such drafts, as "
                "ModelOpt does) is served as it was trained: no finding"
            ),
        ),
        Code(
            "weights_dropped",
            "error",
            "the engine's loader maps checkpoint names onto its own parameter names and skips a name it does not know "
            "without an error, so a trainer's other naming is lost at load",
            "rename the checkpoint keys to the engine's names (e.g. layers.0.* <-> midlayer.*) or add a name map",
            evidence=(
                "an error when a checkpoint tensor's name maps to no parameter of the engine's loader (its name map "
                "replayed, or the load observed)"
            ),
        ),
        Code(
            "weights_missing",
            "error",
            "a parameter the loader finds no tensor for keeps its random initial value, and the engine serves it without an error",
            "add the missing tensors to the checkpoint, or configure the engine to take them from the target",
            evidence=(
                "an error when a parameter the engine builds and applies receives no tensor; the fc of a last-state "
                "draft, built but never applied (its input is as wide as the embedding), is not reported"
            ),
        ),
        Code(
            "aux_layers_mismatch",
            "error",
            "trainers and engines count aux layer ids differently (SpecForge's id k is the output of block k, speculators' "
            "id k is boundary k, SGLang's Llama target adds 1 to each id): ids written for one reading shift the chunks",
            "write the layer ids in the convention the engine applies so the captured boundaries equal the trained ones",
            evidence=(
                "an error when the boundaries the engine captures differ from the trained ones under the one reading "
                "the evidence leaves: the trainer's record, the provenance config.json states, or a layout that signs "
                "its trainer (SpecForge: midlayer.* tensors and eagle_config; speculators: its own config). A warning "
                "when a layout no trainer signs leaves two readings and only one of them is captured"
            ),
        ),
        Code(
            "aux_capture_disabled",
            "error",
            "SGLang's target captures aux hidden states only under --speculative-algorithm EAGLE3 with "
            "eagle_config.use_aux_hidden_state true; otherwise it hands the draft its last hidden state alone",
            "launch with --speculative-algorithm EAGLE3 and set eagle_config.use_aux_hidden_state=true",
            evidence=(
                "an error when aux capture is off for a draft trained on fused aux states (its checkpoint holds a "
                "trained fc, or its trainer trains no other kind); not raised for a last-state draft "
                "(use_aux_hidden_state false and no fc)"
            ),
        ),
        Code(
            "algorithm_mismatch",
            "error",
            "what the target captures is set by the launch flag, not read from the draft's config: only EAGLE3 makes it capture aux states",
            "use --speculative-algorithm EAGLE3 for an EAGLE-3 draft (LlamaForCausalLMEagle3)",
            evidence=(
                "an error when the server's speculative algorithm is not EAGLE3 for an EAGLE-3 draft class (read from the launch arguments)"
            ),
        ),
        Code(
            "draft_class_mismatch",
            "error",
            "the engine picks the draft class from the checkpoint's architectures (renaming some target names to their "
            "NextN/MTP head): an EAGLE-3 checkpoint mapped to a NextN, MTP or EAGLE-1 class loads and runs as that class, "
            "and a draft whose target class is not renamed builds the full target model as the draft",
            "set architectures to an EAGLE-3 draft class (SGLang: LlamaForCausalLMEagle3) and launch with --speculative-algorithm EAGLE3",
            evidence=(
                "an error when the class the engine's registry builds for the checkpoint's architectures is not an EAGLE-3 draft class"
            ),
        ),
        Code(
            "unsupported_config_flag",
            "error",
            "the engine's draft class reads only the config keys it implements: a training flag it does not implement "
            "is skipped without a word, and the draft computes other than it was trained to",
            "retrain without the flag, or serve with an engine that implements it",
            evidence=(
                "an error when the config sets a training flag that the audited release's draft class was read not to "
                "implement; a warning when that release was not read; info when nothing is lost (ignored top-level "
                "ids whose engine defaults capture the same boundaries)"
            ),
        ),
        Code(
            "rope_mismatch",
            "error",
            "the draft attends with the rotary embedding its trainer built, which is not always the target's (SpecForge: "
            "the base its own config gives, 10000 when it names none; the EAGLE trainer: 10000 always; speculators: its "
            "verifier's, saved in transformer_layer_config): the engine builds each rotary from config.json (SGLang 0.5.23: "
            "rope_parameters.rope_theta, else a top-level rope_theta, else 10000), so a base or scaling written elsewhere, "
            "or lost, rotates every position with another phase than in training, without an error",
            "write the rotary the draft was trained with into its config.json, where the engine reads it (rope_parameters, "
            "or transformer_layer_config.rope_parameters for a speculators config); when which one is not known, "
            "spectrace probe TRACE_DIR --draft DRAFT_DIR decides it",
            evidence=(
                "an error when the engine provably builds another rotary than the draft was trained with: a record "
                "states the trained base (run.yaml, train_command.txt, trained_rope_theta), or the trainer is known "
                "or recognised and its rule (spectrace/rules/trainers.py: SpecForge's rule per release, the EAGLE "
                "trainer's fixed 10000, speculators' transformer_layer_config, ModelOpt's exported keys) applied to "
                "this config gives another base, scaling, rotated width or style; or the engine cannot build the "
                "draft's rotary at all. A warning naming `spectrace probe TRACE_DIR --draft DRAFT_DIR` when the files "
                "cannot tell: the trainer is unknown, its releases disagree on this config, or the config names no "
                "base while the target's differs (a draft trained at its target's base whose config lost the key "
                "looks exactly like a healthy SpecForge draft). The target's rotary alone is never evidence"
            ),
        ),
        Code(
            "vocab_map_invalid",
            "error",
            "d2t stores offsets (draft id i is target id i + d2t[i]) over the draft vocabulary, and t2d marks the same "
            "target ids; the engine builds its map from d2t alone and checks nothing, so a map of the wrong length, "
            "out of range, out of order or at odds with t2d (a trainer's default d2t = arange maps i to 2i) proposes "
            "other tokens than the draft meant",
            "save the d2t and t2d of the draft vocabulary the draft was trained on (d2t = ids - arange(len(ids)) "
            "for its target ids in rising order)",
            evidence=("an error when d2t and t2d, read by value, break the map's rules (length, range, order, agreement with each other)"),
        ),
        Code(
            "shape_mismatch",
            "error",
            "fc.in_features, the checkpoint's tensor shapes and the target's hidden size must agree: a width that differs "
            "fails at load or at the first forward",
            "make fc.in_features equal num_aux x target hidden size",
            evidence=("an error when a width the engine builds differs from what the checkpoint's shapes or the target's config provide"),
        ),
        Code(
            "feature_skew",
            "error",
            "a chunk fed by another layer than in training (or by a normed or scaled state) has other statistics than "
            "the fingerprint recorded while the training data was generated",
            "check which target layers feed each chunk (layer ids and their convention)",
            evidence=(
                "an error when a served chunk's statistics fall outside the fingerprint recorded while the training data was generated"
            ),
        ),
        Code(
            "chunk_provenance",
            "error",
            "the capture record says what the engine was told to capture; a patched release, layers_to_capture set after "
            "load or another concat order makes the stored chunks other boundaries of the residual stream",
            "find what changed the capture (a patched or other engine release, layers_to_capture set after load, the aux "
            "states concatenated in another order), then write the layer ids so the boundaries really captured equal the "
            "ones the draft was trained on",
            evidence=("an error when the boundaries the chunks were measured to come from differ from those the capture record names"),
        ),
        Code(
            "chunk_unmatched",
            "error",
            "the engine stores the raw residual stream at each captured boundary; a chunk that equals none of them was "
            "written by something else (a norm or scale before the concat, a layer's partial output, a stale buffer)",
            "find what writes the aux hidden states: the draft expects the raw residual stream (hidden_states + residual) at "
            "its trained boundaries, over the step's own rows; check a stale buffer under CUDA-graph replay and any norm or "
            "scale applied before the concat",
            evidence=("an error when a stored chunk equals the residual stream at none of the captured boundaries"),
        ),
        Code(
            "values_boundary_mismatch",
            "error",
            "by value, chunks of the served fused draft input are other hidden states of the target than the draft was "
            "trained on: recomputed for the same token ids, each chunk equals another boundary (spectrace compare-train)",
            "write eagle_aux_hidden_state_layer_ids so the engine captures the boundaries the draft was trained on",
            evidence=(
                "an error when compare-train's recomputation, for the same token ids, shows a chunk equal to another "
                "boundary than the trained one"
            ),
        ),
        Code(
            "values_chunk_unmatched",
            "error",
            "a chunk of the served fused draft input equals no hidden state of the target recomputed for the same token "
            "ids (spectrace compare-train): another target, other weights or dtype, or rows of other tokens",
            "compare against the exact target the server loads (same folder, same revision); if it is, find what writes "
            "the aux hidden states (a norm or scale before the concat, a stale buffer under CUDA-graph replay)",
            evidence=("an error when compare-train's recomputation, for the same token ids, finds no boundary equal to a chunk"),
        ),
        Code(
            "acceptance_collapse",
            # A symptom, not a cause: the error findings beside it say why; alone, it points
            # at the draft's training rather than at the wiring spectrace can check.
            "warning",
            "the target accepts a draft token only where it would have chosen it: a draft fed other inputs or weights than "
            "it was trained with, or trained for another target, proposes tokens it rejects",
            "look at the error findings: acceptance collapses when the draft's inputs or weights are wrong; "
            "with none, check the draft's training and that it was trained for this target",
            evidence=("a warning: a symptom; the error findings beside it are its evidence"),
        ),
        Code(
            "nonfinite",
            "error",
            "a NaN or Inf spreads through every later operation: the first module that holds one is where it entered "
            "(a bad weight, an fp16 overflow, a bad input)",
            "find the first module whose output is non-finite and check its inputs and dtype",
            evidence=("an error when a module's output holds a NaN or Inf"),
        ),
        Code(
            "short_capture",
            "error",
            "the engine's capture loop walks the target's layers: an id past the last layer is never reached and is "
            "dropped without an error, and ids that map to one layer capture it once",
            "use layer ids below the target's layer count; the engine drops the others without a word",
            evidence=(
                "an error when the engine's capture loop provably yields fewer distinct boundaries than the draft was "
                "trained on (ids past the last layer, defaults that collide)"
            ),
        ),
        Code(
            "capture_unsupported",
            "error",
            "a release's target forward captures only what its code handles (a Llama target before 0.5.22 has no "
            "residual yet at layer 0, so no embedding output; DeepSeek raises on fewer layers than ids): it fails at the "
            "first forward, on a server at CUDA-graph capture, and says nothing else",
            "serve with a release whose target captures these layers, or retrain the draft on layers this "
            "release can capture; rewriting the ids alone does not help, the draft was trained on those chunks",
            evidence=("an error when the audited release's capture code was read to fail on these ids and this target"),
        ),
        Code(
            "logits_fallback",
            "error",
            "SGLang's logits processor stores the aux concat for the draft when the target captured one, and its final "
            "normed hidden state otherwise: the draft then gets one hidden-size-wide state",
            "enable aux capture on the target (EAGLE3 algorithm, use_aux_hidden_state)",
            evidence=("an error when the draft was handed the final normed hidden state where it was trained on the aux concat"),
        ),
        Code(
            "weights_replaced_after_load",
            "error",
            "an engine step after the load swapped a trained draft tensor for another (SGLang: a config with "
            "draft_vocab_size null takes the target's lm_head, set_embed_and_head; any draft as wide as the target gets "
            "its embedding, set_embed): the load looks perfect and the draft runs with weights it was not trained with",
            "keep the trained tensor: write the config key the engine reads (draft_vocab_size) so it does not share the "
            "target's, or train the draft with the tensor the engine shares",
            evidence=("an error when a trained draft tensor was observed swapped for another after the load"),
        ),
        Code(
            "acceptance_sampled",
            "warning",
            "a sampled request (temperature > 0) accepts a draft token with probability min(1, p_target/p_draft): its "
            "acceptance is bounded by the overlap of the two distributions, lower than greedy, and says nothing of the "
            "wiring when greedy requests of the same run accept well",
            "judge the draft on greedy requests (temperature 0): send a few and compare their accept length; a low "
            "greedy one points at the wiring or the training, a low sampled one alone at the sampling",
            evidence=("a warning: sampled acceptance says nothing of the wiring by itself"),
        ),
        Code(
            "acceptance_synthetic",
            "warning",
            "the engine simulates acceptance (SGLang's SGLANG_SIMULATE_ACC_LEN, vLLM's synthetic rejection sampling): "
            "accept lengths come from a set rate, not from the draft, and no acceptance finding can be trusted",
            "unset the simulation (SGLANG_SIMULATE_ACC_LEN, rejection_sample_method) to measure the draft",
            evidence=("a warning: simulated acceptance is no measurement"),
        ),
        Code(
            "acceptance_drift",
            "warning",
            "the accept length fell during the run at a comparable batch: the draft's weights do not change, so state "
            "carried between requests does (prefix/radix-cache blocks reused or committed before their KV was written, "
            "KV reuse across requests)",
            "rerun the window where it fell with the prefix/radix cache off (SGLang --disable-radix-cache, vLLM "
            "--no-enable-prefix-caching); if acceptance then holds, report the cache bug to the engine",
            evidence=("a warning: a fall at a comparable batch, pointing at state carried between requests"),
        ),
        Code(
            "acceptance_workload",
            "warning",
            "a draft proposes what it has seen in the context: output that loops (the same n-grams again, typical of a "
            "prompt sent without the chat template) is easy to draft, so the accept length measures the text, not the "
            "draft or its wiring",
            "judge the draft on requests that do not loop: prompts through the model's chat template, or a repetition penalty",
        ),
        Code(
            "later_positions_rejected",
            "warning",
            "the target accepts draft position i only after positions 1..i-1: a draft accepted at its first position and "
            "almost never at the second runs its later steps on other inputs than its first (a CUDA graph replaying the "
            "draft's later steps with stale buffers, a wrong hidden-state handoff between draft steps), while the mean "
            "accept length stays above the collapse floor",
            "rerun without CUDA graphs (vLLM --enforce-eager, SGLang --disable-cuda-graph): if the later positions are then "
            "accepted the graph replay is at fault; if not, check the hidden state the draft feeds back to its later steps",
        ),
        Code(
            "replay_divergence",
            "error",
            "spectrace replay fed the served draft's kept inputs to a reference draft loaded from its checkpoint, module "
            "by module, and one module computed something else than the checkpoint does on the same inputs: the engine "
            "runs the draft otherwise than it was trained (a rotary base or style, a norm placement, a replaced head, a map)",
            "fix the first diverging module the finding names, with the causes listed for it (docs/replay.md); rerun "
            "spectrace replay until it says the served draft matches its checkpoint",
            evidence=(
                "an error when a module of the served draft computes otherwise than the reference loaded from its "
                "checkpoint, on the same kept inputs"
            ),
        ),
        Code(
            "probe_better_variant",
            "error",
            "spectrace probe measured the served draft's top-1 agreement with its target's own next-token choice, on "
            "the served draft's kept inputs, as served and under each candidate setting (rotary base and style, "
            "norm_before_residual, the draft's own embedding, the vocabulary map from t2d): one setting agrees "
            "measurably better (its Wilson interval lies above the served one), so the draft was trained that way and "
            "is served otherwise",
            "serve the draft with the setting that won (the finding's fix says which key to set); rerun spectrace "
            "probe until it says the draft is served as trained",
        ),
        Code(
            "probe_served_as_trained",
            "info",
            "spectrace probe measured the served draft's top-1 agreement with its target's own next-token choice "
            "under each candidate setting, and none agrees measurably better than the draft as served: on the axes "
            "it measured, the draft is served as it was trained (the config warnings about those axes are withdrawn)",
            "nothing to fix on the axes the probe measured",
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
