"""The EAGLE-3 trainers as knowledge: what each one trains a draft to compute, and how a
checkpoint shows which one wrote it.

A draft computes what its trainer built, not what its target does. The checks compare what
the serving engine builds with what the *trainer* trained with (:func:`trained_rotary`), so a
draft is never blamed for a choice its trainer made on purpose: SpecForge's Llama drafts rotate
with the base their own config gives (10000 when it gives none), whatever the target's;
the EAGLE reference trainer always rotates with 10000. Each entry cites the trainer's source.

The trainer of a checkpoint is *known* from a record (``--trained-with``, the folder's
provenance files, the keys spectrace's pipeline stamps into config.json) or *recognised*
from the layout that signs it (tensor prefixes, config keys), with how sure and why. A
checkpoint converted into another trainer's format (``speculators_model_type`` written by a
converter) is not taken to be that trainer's work: the format says who wrote the file, not
who trained the weights.

    >>> found = recognise({"midlayer.self_attn.q_proj.weight"}, {"architectures": ["LlamaForCausalLMEagle3"],
    ...                    "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 11, 21]}})
    >>> found.trainers, found.how
    (('specforge',), 'signature')
    >>> trained_rotary("specforge", RopeConfig()).base  # doctest: +ELLIPSIS
    10000.0
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

# The command that decides what a config cannot: it runs the draft's own weights on the
# target's captured states under each candidate (built by ``spectrace probe``).
PROBE_COMMAND = "spectrace probe TRACE_DIR --draft DRAFT_DIR"

# The base a transformers config class gives a Llama draft whose config names none
# (LlamaConfig's default rope_theta; transformers 5's ``default_theta``).
LLAMA_DEFAULT_BASE = 10000.0


@dataclass(frozen=True)
class RopeConfig:
    """The rotary keys of the config a trainer built the draft from, as written (plain values)."""

    rope_theta: float | None = None  # top-level rope_theta
    rope_parameters: Mapping[str, Any] | None = None
    rope_scaling: Mapping[str, Any] | None = None
    partial_rotary_factor: float | None = None


@dataclass(frozen=True)
class TrainedRotary:
    """The rotary a trainer rotated the draft's queries and keys with."""

    base: float
    rope_type: str  # "default": no scaling
    factor: float | None
    partial_rotary_factor: float  # 1.0: the whole head rotated
    why: str  # the trainer's rule, in words, with its source
    # The base came from the config: a config that lost its key would have trained another one.
    from_config: bool = True

    def same_as(self, base: float, rope_type: str, factor: float | None, partial: float) -> bool:
        def close(a: float | None, b: float | None) -> bool:
            return a is b if a is None or b is None else abs(a - b) <= 1e-6 * max(abs(a), abs(b), 1.0)

        scaled_alike = rope_type == self.rope_type and (rope_type == "default" or close(factor, self.factor))
        return close(base, self.base) and scaled_alike and close(partial, self.partial_rotary_factor)


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _transformers_params(rope: RopeConfig) -> tuple[float | None, dict[str, Any]]:
    """(base, scaling dict) as a transformers config class hands them to a model: ``rope_scaling``
    (the old name) in place of ``rope_parameters`` when both are written, the dict's own base
    before a top-level one; None: no base anywhere (the class default applies)."""
    params = dict(rope.rope_scaling or rope.rope_parameters or {})
    base = _num(params.get("rope_theta"))
    return (base if base is not None else rope.rope_theta), params


def _scaling(params: Mapping[str, Any]) -> tuple[str, float | None]:
    kind = str(params.get("rope_type") or params.get("type") or "default")
    return kind, (_num(params.get("factor")) if kind != "default" else None)


def _reads_config(rope: RopeConfig, *, partial: bool, who: str) -> TrainedRotary:
    """A trainer that builds its rotary from the draft's config as transformers reads it."""
    base, params = _transformers_params(rope)
    kind, factor = _scaling(params)
    frac = (rope.partial_rotary_factor or _num(params.get("partial_rotary_factor")) or 1.0) if partial else 1.0
    stated = f"{base:g}" if base is not None else f"{LLAMA_DEFAULT_BASE:g}, the Llama class default (the config names no base)"
    return TrainedRotary(base if base is not None else LLAMA_DEFAULT_BASE, kind, factor, frac, f"{who}: base {stated}")


# ------------------------------------------------------------------ SpecForge's releases
#
# specforge/modeling/draft/llama3_eagle.py, LlamaAttention._init_rope (history of
# github.com/sgl-project/SpecForge). The draft's LlamaRotaryEmbedding always gets head_dim:
# partial_rotary_factor is never read, the whole head rotates. Three rules, named here by the
# release that first shipped them:
# - "0.1.0" (v0.1.0, 2025-07-22): no rope_scaling -> LlamaRotaryEmbedding(head_dim) with no base:
#   10000; "llama3" -> the same plain 10000 rotary ("for nv type"); linear/dynamic -> 10000 scaled.
# - "0.1.1" (#270, 2025-10-30, and #287, 2025-11-12; v0.1.1 and the v0.2.0 tag): no rope_scaling ->
#   base getattr(config, "rope_theta", 10000); "llama3" -> that base with llama3 frequency scaling;
#   linear/dynamic still pass no base (10000). It ran on transformers 4.
# - "0.2.0" (1712b656, 2026-07-17, get_rope_config; the 0.2.0 package on the registry, 2026-08):
#   transformers 5's rope_parameters (its rope_theta; type "default" -> plain) and every scaling
#   type passes base=rope_theta: the draft's config as transformers reads it.

SPECFORGE_RELEASES = ("0.1.0", "0.1.1", "0.2.0")


def _specforge(rope: RopeConfig, release: str) -> TrainedRotary | None:
    where = "specforge/modeling/draft/llama3_eagle.py::LlamaAttention._init_rope"
    if release == "0.2.0":
        return _reads_config(rope, partial=False, who=f"SpecForge 0.2.0 ({where}, get_rope_config)")
    if rope.rope_parameters and rope.rope_theta is None and not rope.rope_scaling:
        # A transformers 5 config (rope_parameters only): 0.1.x ran on transformers 4, which writes
        # rope_theta / rope_scaling; no release before get_rope_config read such a file.
        return None
    params = dict(rope.rope_scaling or {})  # transformers 4 exposes rope_scaling only
    kind, factor = _scaling(params) if params else ("default", None)
    base = rope.rope_theta if rope.rope_theta is not None else _num(params.get("rope_theta"))
    if release == "0.1.0":
        kind, factor = ("default", None) if kind in ("default", "llama3") else (kind, factor)
        return TrainedRotary(
            LLAMA_DEFAULT_BASE, kind, factor, 1.0, f"SpecForge 0.1.0 ({where}): base 10000 whatever the config says", False
        )
    if kind in ("linear", "dynamic"):
        return TrainedRotary(LLAMA_DEFAULT_BASE, kind, factor, 1.0, f"SpecForge 0.1.1 ({where}): {kind} scaling on base 10000", False)
    got = base if base is not None else LLAMA_DEFAULT_BASE
    return TrainedRotary(got, kind, factor, 1.0, f"SpecForge 0.1.1 ({where}): base getattr(config, 'rope_theta', 10000) = {got:g}")


# ------------------------------------------------------------------ the trainers


@dataclass(frozen=True)
class TrainerProfile:
    """One trainer: its rotary rule, capture-id convention, the layout that signs it, and what it allows."""

    name: str
    label: str
    convention: str  # how its ids map to boundaries: "specforge" (output of block k), "speculators" (boundary k)
    tensor_prefixes: tuple[str, ...]  # the decoder layer's names in its checkpoints
    config_keys: tuple[str, ...]  # keys only it writes (top level or inside eagle_config)
    last_state_ok: bool  # trains drafts on the target's last hidden state (no aux capture, no fc)
    norm_flags: tuple[str, ...]  # the normalisation flags it honours
    source: str
    releases: tuple[str, ...] = ()  # versions whose rotary rules differ, oldest first
    notes: tuple[str, ...] = field(default=())


TRAINERS: dict[str, TrainerProfile] = {
    "specforge": TrainerProfile(
        name="specforge",
        label="SpecForge",
        convention="specforge",  # specforge/modeling/target: aux ids are layer outputs (boundary = id + 1)
        tensor_prefixes=("midlayer.",),
        config_keys=("eagle_config",),
        last_state_ok=False,  # configs/*.json all train on aux states (fc over 3 x hidden)
        norm_flags=(),  # its LlamaDecoderLayer has no norm_before_residual switch
        source="specforge/modeling/draft/llama3_eagle.py (LlamaForCausalLMEagle3, _init_rope); export/to_sglang.py",
        releases=SPECFORGE_RELEASES,
    ),
    "eagle": TrainerProfile(
        name="eagle",
        label="the EAGLE reference trainer",
        # eagle/traineagle3/modeling_llama_kv.py: hidden_states entering layers 2, n//2, n-3 (boundaries [2, n//2, n-3]).
        convention="speculators",
        tensor_prefixes=("midlayer.",),
        config_keys=(),
        last_state_ok=False,
        norm_flags=(),
        source="eagle/traineagle3/cnets.py (LlamaAttention._init_rope, Model.dataprepare)",
    ),
    "speculators": TrainerProfile(
        name="speculators",
        label="speculators",
        convention="speculators",
        tensor_prefixes=("layers.",),
        config_keys=("speculators_model_type", "transformer_layer_config"),
        last_state_ok=False,
        norm_flags=("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output"),
        # models/eagle3/core.py Eagle3DraftModel.__init__: rotary_emb_class(flatten_rope_parameters(
        # transformer_layer_config)); from_training_args puts the verifier's config there.
        source="speculators/models/eagle3/core.py (Eagle3DraftModel.__init__, from_training_args)",
    ),
    "modelopt": TrainerProfile(
        name="modelopt",
        label="ModelOpt",
        # HFEagleModel._set_default_aux_hidden_state_layers: [1, n//2 - 1, n - 4], layer outputs.
        convention="specforge",
        tensor_prefixes=("midlayer.",),
        config_keys=("use_input_layernorm_in_first_layer", "use_last_layernorm", "use_mtp_layernorm", "next_layer_regular"),
        last_state_ok=True,  # eagle/default_config.py: use_aux_hidden_state defaults to False
        norm_flags=("use_input_layernorm_in_first_layer", "use_last_layernorm", "use_mtp_layernorm"),
        source="modelopt/torch/speculative/eagle/default_config.py; torch/export/plugins/hf_spec_export.py (export_spec_ckpt_config)",
    ),
    "spectrace": TrainerProfile(
        name="spectrace",
        label="spectrace's reference pipeline",
        convention="stated",  # it stamps trainer_convention and trained_aux_boundaries
        tensor_prefixes=("midlayer.", "model.layers."),
        config_keys=("trainer_convention", "trained_aux_boundaries"),
        last_state_ok=False,
        norm_flags=("norm_before_residual",),
        source="spectrace/eagle3/draft.py (DraftAttention: rotary(config.rope_theta), whole head)",
    ),
}


def trained_rotary(trainer: str, rope: RopeConfig, release: str | None = None, verifier_base: float | None = None) -> TrainedRotary | None:
    """The rotary ``trainer`` (one of :data:`TRAINERS`) trains with from a draft config's keys.

    ``release``: one of the trainer's ``releases`` (SpecForge); None: its newest.
    ``verifier_base``: the target's base, for a trainer that takes its rotary from the target.
    None: that release could not have read this config."""
    if trainer == "specforge":
        return _specforge(rope, release or SPECFORGE_RELEASES[-1])
    if trainer == "eagle":
        # cnets.py LlamaAttention._init_rope: LlamaRotaryEmbedding(head_dim, max_position_embeddings)
        # whatever rope_theta says; rope_scaling only linear/dynamic (on base 10000).
        kind, factor = _scaling(rope.rope_scaling) if rope.rope_scaling else ("default", None)
        if kind not in ("linear", "dynamic"):
            kind, factor = "default", None
        return TrainedRotary(
            LLAMA_DEFAULT_BASE,
            kind,
            factor,
            1.0,
            "the EAGLE reference trainer (eagle/traineagle3/cnets.py::_init_rope): base 10000 always",
            False,
        )
    if trainer == "speculators":
        got = _reads_config(rope, partial=True, who="speculators (its transformer_layer_config, as transformers reads it)")
        if _transformers_params(rope)[0] is None and verifier_base is not None:
            # from_training_args trains with the verifier's own config; under transformers 5 the saved
            # transformer_layer_config could lose its base (speculators#574): the verifier's is the trained one.
            why = (
                f"speculators trains with its verifier's config (from_training_args): base {verifier_base:g}; "
                "its saved transformer_layer_config names no base (lost on saving, speculators#574)"
            )
            return TrainedRotary(verifier_base, got.rope_type, got.factor, got.partial_rotary_factor, why)
        return got
    if trainer == "modelopt":
        return _reads_config(rope, partial=True, who="ModelOpt (the rope_theta / rope_scaling it exports)")
    if trainer == "spectrace":
        return _reads_config(rope, partial=False, who="spectrace's reference pipeline (config rope_theta)")
    raise ValueError(f"unknown trainer {trainer!r}; known: {', '.join(TRAINERS)}")


def trained_rotaries(trainers: Collection[str], rope: RopeConfig, verifier_base: float | None = None) -> list[tuple[str, TrainedRotary]]:
    """Every rotary the candidate trainers (and their releases) would have trained with: one
    entry per (trainer[ release], rotary)."""
    out: list[tuple[str, TrainedRotary]] = []
    for name in trainers:
        profile = TRAINERS[name]
        for release in profile.releases or (None,):
            label = profile.label + (f" {release}" if release else "")
            got = trained_rotary(name, rope, release, verifier_base)
            if got is not None:
                out.append((label, got))
    return out


# ------------------------------------------------------------------ which trainer wrote it

How = Literal["record", "signature", "unknown"]
# Keys only speculators' trainer writes; left in an SGLang-format config they say it was converted
# by hand from a speculators checkpoint (readings.SPECULATORS_FLAGS, kept here torch-free and leaf).
SPECULATORS_ONLY = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output", "embed_requires_grad")


@dataclass(frozen=True)
class Recognition:
    """Which trainer(s) a checkpoint is from, and on what evidence."""

    trainers: tuple[str, ...]  # one: known or recognised; several: any of these; none: unknown
    how: How
    why: str
    # The layout is the trainer's own (not a conversion): its ids follow that trainer's convention.
    settles_ids: bool = False

    @property
    def known(self) -> bool:
        return bool(self.trainers)

    @property
    def sure(self) -> str:
        """How sure: ``certain`` (a record says so), ``likely`` (the trainer's own layout signs it),
        ``possible`` (a config's keys alone, a conversion, or several candidates), ``unknown``."""
        if self.how == "record":
            return "certain"
        if not self.trainers:
            return "unknown"
        return "likely" if self.settles_ids and len(self.trainers) == 1 else "possible"

    def summary(self) -> dict[str, Any]:
        return {"trainers": list(self.trainers), "how": self.how, "sure": self.sure, "why": self.why}

    @property
    def label(self) -> str:
        return " or ".join(TRAINERS[t].label for t in self.trainers) or "an unknown trainer"

    @property
    def convention(self) -> str | None:
        """The id convention the layout settles (None: not settled, or the trainers disagree)."""
        found = {TRAINERS[t].convention for t in self.trainers}
        return found.pop() if self.settles_ids and len(found) == 1 else None


def _record_trainer(record: str | None) -> str | None:
    value = (record or "").strip().lower()
    return value if value in TRAINERS else None


def recognise(
    tensor_names: Collection[str],
    config: Mapping[str, Any],
    record: str | None = None,
    record_source: str = "",
) -> Recognition:
    """The trainer of a checkpoint: from ``record`` (what its folder or the user says) when
    there is one, else from the layout that signs it. Without ``tensor_names`` (a live engine,
    which renamed them) the config's keys alone are read, and the reason says so."""
    named = _record_trainer(record)
    if named is not None and not (named == "speculators" and record_source.startswith("config.json")):
        return Recognition((named,), "record", f"{TRAINERS[named].label}: {record_source or 'the trainer record'}", True)
    if config.get("trainer_convention") and config.get("trained_aux_boundaries") is not None:
        return Recognition(
            ("spectrace",), "record", "spectrace's reference pipeline: trainer_convention and trained_aux_boundaries in config.json", True
        )
    found = config.get("eagle_config")
    eagle: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    names = list(tensor_names)
    seen = bool(names)
    midlayer = any(n.startswith("midlayer.") for n in names) or not seen
    layers = any(n.startswith(("layers.", "model.layers.")) for n in names) or not seen
    tensors = "midlayer.* tensors and " if seen else ""
    archs = [str(a) for a in config.get("architectures") or []]
    modelopt = sorted(k for k in TRAINERS["modelopt"].config_keys if k in eagle)
    flags = [k for k in SPECULATORS_ONLY if k in config]
    if "transformer_layer_config" in config and "speculators_model_type" in config:
        if layers and not (seen and midlayer):
            # Trained by speculators, or converted into its format (convert/eagle/eagle3_converter.py
            # writes the source's rope_theta, default 10000, into transformer_layer_config): either way
            # transformer_layer_config holds the rotary it was trained with.
            return Recognition(
                ("speculators",),
                "signature",
                "speculators: its own config (transformer_layer_config)" + (" and layers.* tensors" if seen else ""),
                True,
            )
        return Recognition(
            (), "unknown", "a speculators-format config over midlayer.* tensors: converted, so the format does not name the trainer"
        )
    if midlayer and modelopt:
        return Recognition(("modelopt",), "signature", f"ModelOpt: {tensors}eagle_config.{', eagle_config.'.join(modelopt)}", True)
    if midlayer and eagle and flags:
        # A hand conversion: the weights are speculators', the ids may or may not have been translated.
        return Recognition(
            ("speculators",),
            "signature",
            f"speculators' training flags ({', '.join(flags)}) in an SGLang-format config: converted from speculators",
        )
    if midlayer and eagle and any("Eagle3" in a for a in archs):
        return Recognition(("specforge",), "signature", f"SpecForge: {tensors}eagle_config", seen)
    if midlayer and any("Eagle3" in a for a in archs):
        # SpecForge's configs/llama3-8B-eagle3.json is the EAGLE template with LlamaForCausalLMEagle3.
        return Recognition(
            ("specforge", "eagle"), "signature", f"SpecForge or the EAGLE trainer: {tensors}LlamaForCausalLMEagle3, no eagle_config", seen
        )
    if seen and midlayer and not eagle:
        return Recognition(
            ("eagle",), "signature", "the EAGLE reference trainer: midlayer.* tensors and its plain LlamaForCausalLM config", True
        )
    return Recognition((), "unknown", "no trainer record, and the layout signs no trainer spectrace knows")
