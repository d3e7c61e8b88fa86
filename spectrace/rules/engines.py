"""What each serving engine's EAGLE-3 draft class expects, and how it maps checkpoint names.

Each engine is modelled from its source: the parameters the draft class creates
(names and shapes for a given config), the ``load_weights`` name mapping replayed on
the checkpoint's names, where it reads the aux layer ids and which capture rule its
target applies. Nothing here imports an engine, a file reader or torch: the audit's
checks read these rules as they read the rest of :mod:`spectrace.rules`.

    >>> eng = get_engine("sglang", "0.5.23")
    >>> cfg = read_checkpoint(Path("tests/fixtures/specforge_tiny")).config  # spectrace.audit.checkpoint
    >>> eng.route("midlayer.self_attn.q_proj.weight", eng.params(dims_of(cfg)))
    Route(kind='param', param='model.layers.0.self_attn.qkv_proj.weight', shard='q', note='')
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol

from .conventions import (
    SGLANG_DRAFT_FLAG_NAMES,
    SGLANG_DRAFT_READ,
    SGLangDraftFlag,
    engine_rule,
    first_sglang_implementing,
    sglang_draft_flag,
    sglang_flag_value,
    version_tuple,
)
from .vllm import VLLM_READ, vllm_release

RouteKind = Literal["param", "special", "skipped", "dropped"]

# (fused param, checkpoint shard name, shard id): the same table in SGLang and vLLM.
STACKED = (
    (".qkv_proj", ".q_proj", "q"),
    (".qkv_proj", ".k_proj", "k"),
    (".qkv_proj", ".v_proj", "v"),
    (".gate_up_proj", ".gate_proj", 0),
    (".gate_up_proj", ".up_proj", 1),
)
# SGLang's load_weights rewrites these substrings first, in this order (legacy_name_map:
# models/llama_eagle3.py, 0.5.14 to 0.5.16 l.310-315, 0.5.17 to 0.5.21 l.327-332, 0.5.22
# l.335-340, 0.5.23 l.338-343).
SGLANG_LEGACY_NAMES = (
    ("midlayer", "layers.0"),
    ("aux_norm_low", "fc_norm.0"),
    ("aux_norm_mid", "fc_norm.1"),
    ("aux_norm_high", "fc_norm.2"),
)
# The first release whose loader reads both decoder-layer names (the map above); every
# release before it expects midlayer.* and drops layers.0.* without a word (SGLANG_OLDER).
SGLANG_READS_BOTH_LAYER_NAMES = SGLANG_DRAFT_READ[0]


def layer_rename_note(renames: dict[str, str]) -> str | None:
    """The other fix of a ``layers.0`` -> ``midlayer`` rename: only SGLang releases before
    0.5.14 drop those names, so upgrading fixes it too (None for any other rename)."""
    if renames.get("layers.0") != "midlayer":
        return None
    return f"serve on SGLang {SGLANG_READS_BOTH_LAYER_NAMES} or later, which reads both names"


# The shape of each parameter a flag makes SGLang's draft class create: over the fused
# aux states (input_norm) or one per aux state (fc_norm.{i}).
_FLAG_PARAM_SHAPE = {"model.input_norm.weight": "fused", "model.fc_norm.{i}.weight": "chunk"}


class DraftConfig(Protocol):
    """What the engine models read of a draft's config.json: ``checks.facts.DraftConfigFile``
    (read-only, so the facts' narrower types fit)."""

    @property
    def format(self) -> str: ...
    @property
    def hidden_size(self) -> int: ...
    @property
    def num_attention_heads(self) -> int: ...
    @property
    def num_key_value_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def intermediate_size(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def num_hidden_layers(self) -> int: ...
    @property
    def draft_vocab_size(self) -> int | None: ...
    @property
    def target_hidden_size(self) -> int | None: ...
    @property
    def tie_word_embeddings(self) -> bool: ...
    @property
    def fc_bias(self) -> bool: ...
    @property
    def eagle_config_ids(self) -> list[int] | None: ...
    @property
    def flags(self) -> dict[str, bool]: ...


@dataclass(frozen=True)
class Dims:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    draft_vocab: int | None
    target_hidden: int
    num_layers: int
    tie: bool
    fc_bias: bool
    norm_before_fc: bool = False
    # SGLang's num_aux_hidden_states: len(eagle_config ids), else 3 (models/llama_eagle3.py,
    # 0.5.14 l.148-153, 0.5.23 l.156-161); fc and the flag norms are built for it.
    num_aux: int = 3
    flags: frozenset[str] = frozenset()  # training flags set to true at the top level of config.json


def dims_of(cfg: DraftConfig) -> Dims:
    return Dims(
        hidden=cfg.hidden_size,
        heads=cfg.num_attention_heads,
        kv_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        intermediate=cfg.intermediate_size,
        vocab=cfg.vocab_size,
        draft_vocab=cfg.draft_vocab_size,
        target_hidden=cfg.target_hidden_size or cfg.hidden_size,
        num_layers=cfg.num_hidden_layers,
        tie=cfg.tie_word_embeddings,
        fc_bias=cfg.fc_bias,
        norm_before_fc=cfg.flags.get("norm_before_fc", False),
        num_aux=len(cfg.eagle_config_ids) if cfg.eagle_config_ids else 3,
        flags=frozenset(k for k, v in cfg.flags.items() if v),
    )


@dataclass(frozen=True)
class Param:
    """One engine parameter: its full shape, the shape each shard of it takes, and why it may stay unwritten."""

    name: str
    shape: tuple[int, ...]
    shards: dict[object, tuple[int, ...]] | None = None
    optional: str | None = None
    flag: str | None = None  # the training flag that makes the engine create it


@dataclass(frozen=True)
class Route:
    kind: RouteKind
    param: str | None = None
    shard: object | None = None
    note: str = ""


@dataclass(frozen=True)
class Engine:
    name: str
    version: str
    draft_class: str
    decoder_prefix: str  # how the engine's checkpoint names spell the decoder layer
    legacy_midlayer: bool  # rewrites midlayer.* -> layers.0.* before matching
    unknown_names_raise: bool  # loud (vLLM) versus silently dropped (SGLang)
    ids_sources: tuple[str, ...]  # where the engine reads aux ids: "top_level", "eagle_config"
    fc_aux_count: int | None  # fc built for this many aux states; None: SGLang's num_aux (Dims.num_aux)
    assumptions: tuple[str, ...] = field(default=())
    # Said only of a speculators-format checkpoint (how this engine would meet one).
    speculators_assumptions: tuple[str, ...] = field(default=())
    # Said only when the checkpoint carries a training flag (norm_before_fc, ...) or is in
    # the speculators format, whose trainer writes them: otherwise they are about nothing.
    flag_assumptions: tuple[str, ...] = field(default=())
    # The release as the user named it (``--engine sglang==0.5.10``) where ``version`` is a
    # model shared by several (``older``: every release before 0.5.14).
    release: str = ""

    @property
    def spec(self) -> str:
        """The ``--engine`` argument that audits against this engine, as the output names it."""
        if self.version == "older":
            return f"{self.name}=={self.release}" if self.release else f"{self.name}<{SGLANG_DRAFT_READ[0]}"
        if self.version == "recent":
            return self.name
        return f"{self.name}=={self.version}"

    @property
    def label(self) -> str:
        """The engine in prose: ``SGLang 0.5.23``, ``SGLang 0.5.10 (a loader before 0.5.14)``."""
        product = "SGLang" if self.name == "sglang" else "vLLM"
        if self.version == "older":
            first = SGLANG_DRAFT_READ[0]
            return f"{product} {self.release} (a loader before {first})" if self.release else f"{product} before {first}"
        return f"{product} {self.version}"

    def assumptions_for(self, cfg: DraftConfig) -> list[str]:
        """What the audit of ``cfg`` assumed about this engine: the notes that concern it."""
        speculators = cfg.format == "speculators"
        notes = [*(self.speculators_assumptions if speculators else ()), *self.assumptions]
        if speculators or cfg.flags:
            notes += self.flag_assumptions
        return notes

    # ------------------------------------------------------------ flags

    def fc_aux(self, d: Dims) -> int:
        """How many aux states the engine builds fc (and the flag norms) for."""
        return self.fc_aux_count or d.num_aux

    def draft_flag(self, flag: str) -> SGLangDraftFlag | None:
        """What this SGLang release's draft class does with ``flag`` (``rules.conventions.SGLANG_DRAFT_FLAGS``)."""
        if self.name != "sglang":
            return None
        return sglang_draft_flag(flag, self.version)

    def flag_params(self, d: Dims) -> dict[str, tuple[tuple[int, ...], str]]:
        """Parameters the draft class creates for the flags this config sets: name -> (shape, flag)."""
        out: dict[str, tuple[tuple[int, ...], str]] = {}
        if self.name != "sglang":
            return out
        aux = self.fc_aux(d)
        seen = {flag: True for flag in d.flags}
        for flag in SGLANG_DRAFT_FLAG_NAMES:
            row = self.draft_flag(flag)
            if row is None or row.support != "implemented" or not sglang_flag_value(row, seen):
                continue
            for pattern in row.params:
                if _FLAG_PARAM_SHAPE.get(pattern) == "chunk":
                    for i in range(aux):
                        out[pattern.format(i=i)] = ((d.target_hidden,), flag)
                else:
                    out[pattern] = ((aux * d.target_hidden,), flag)
        return out

    # ------------------------------------------------------------ parameters

    def params(self, d: Dims) -> dict[str, Param]:
        """The draft class's named parameters for these dims (tied head: no separate lm_head)."""
        h, hd = d.hidden, d.head_dim
        q, kv = d.heads * hd, d.kv_heads * hd
        out: dict[str, Param] = {}

        def add(name: str, shape: tuple[int, ...], shards: dict[object, tuple[int, ...]] | None = None,
                optional: str | None = None) -> None:  # fmt: skip
            out[name] = Param(name, shape, shards, optional)

        set_embed = "the engine gives the draft the target's embedding at start-up (set_embed)"
        add("model.embed_tokens.weight", (d.vocab, h), optional=set_embed)
        aux = self.fc_aux(d)
        add("model.fc.weight", (h, aux * d.target_hidden))
        if d.fc_bias:
            add("model.fc.bias", (h,))
        if d.norm_before_fc and self.name == "vllm":
            add("model.input_norm.weight", (aux * d.target_hidden,))
        for pname, (shape, flag) in self.flag_params(d).items():
            out[pname] = Param(pname, shape, flag=flag)
        for i in range(d.num_layers):
            p = f"model.{self.decoder_prefix}{'' if self.decoder_prefix == 'midlayer' else f'.{i}'}"
            if self.decoder_prefix == "midlayer" and i > 0:
                p = f"model.additional_layers.{i - 1}"
            width = 2 * h if i == 0 else h  # layer 0 attends over cat(embeds, hidden)
            add(f"{p}.self_attn.qkv_proj.weight", (q + 2 * kv, width), {"q": (q, width), "k": (kv, width), "v": (kv, width)})
            add(f"{p}.self_attn.o_proj.weight", (h, q))
            add(f"{p}.mlp.gate_up_proj.weight", (2 * d.intermediate, h), {0: (d.intermediate, h), 1: (d.intermediate, h)})
            add(f"{p}.mlp.down_proj.weight", (h, d.intermediate))
            # vLLM creates hidden_norm in every layer but uses it in layer 0 only.
            unused = i > 0 and self.name == "vllm"
            add(f"{p}.hidden_norm.weight", (h,), optional="unused after layer 0" if unused else None)
            if i == 0 or self.name == "vllm":  # SGLang's later layers have input_layernorm=None
                add(f"{p}.input_layernorm.weight", (h,))
            add(f"{p}.post_attention_layernorm.weight", (h,))
        add("model.norm.weight", (h,))
        if not d.tie:
            if d.draft_vocab is None:
                add("lm_head.weight", (d.vocab, h), optional="config has no draft_vocab_size: lm_head comes from the target")
            else:
                add("lm_head.weight", (d.draft_vocab, h))
        return out

    # ------------------------------------------------------------ name mapping

    def route(self, name: str, params: dict[str, Param]) -> Route:
        """Replay the engine's load_weights on one checkpoint name (substring tests, as the engine does)."""
        if "d2t" in name:
            return Route("special", "hot_token_id" if self.name == "sglang" else "draft_id_to_target_id")
        if "t2d" in name:
            return Route("skipped", note="target-to-draft map, not needed for serving")
        if self.legacy_midlayer and self.name == "sglang":
            for legacy, new in SGLANG_LEGACY_NAMES:
                if legacy in name:
                    name = name.replace(legacy, new)
        elif self.legacy_midlayer and "midlayer." in name:
            name = name.replace("midlayer.", "layers.0.")
        for fused, shard_name, shard in STACKED:
            if shard_name not in name:
                continue
            name = name.replace(shard_name, fused)
            target = name if name in params else f"model.{name}"
            return Route("param", target, shard) if target in params else Route("dropped")
        target = name if name in params else f"model.{name}"
        return Route("param", target) if target in params else Route("dropped")

    def checkpoint_names(self, d: Dims) -> list[str]:
        """The unfused checkpoint names this engine accepts, one per param shard (for rename hints)."""
        names: list[str] = []
        for pname, param in self.params(d).items():
            base = pname.removeprefix("model.")
            if param.shards is None:
                names.append(base)
                continue
            for fused, shard_name, shard in STACKED:
                if fused in base and shard in param.shards:
                    names.append(base.replace(fused, shard_name))
        return names

    def capture_rule(self, target_arch: str) -> str:
        """The id -> boundary convention this engine's target applies."""
        if self.name == "vllm":
            return "speculators"  # vLLM appends the residual stream entering layer k: boundary k
        return engine_rule(target_arch or "LlamaForCausalLM", "0.5.0" if self.version == "older" else self.version)


def _flag_assumption(version: str) -> str:
    """What this release's draft class does with the training flags, from ``SGLANG_DRAFT_FLAGS``."""
    rows = [r for r in (sglang_draft_flag(f, version) for f in SGLANG_DRAFT_FLAG_NAMES) if r is not None]
    if all(r.support == "unknown" for r in rows):
        return (
            "its draft class was not read: whether it implements norm_before_fc, fc_norm, norm_output, "
            "norm_before_residual or embed_requires_grad is not known (each is reported as a warning), and no "
            "input_norm / fc_norm parameters are modelled"
        )

    def name(r: SGLangDraftFlag) -> str:
        made = f" -> {', '.join(p.replace('{i}', 'i') for p in r.params)}" if r.params else ""
        also = " (or use_aux_norm)" if "use_aux_norm" in r.keys else ""
        return f"{r.flag}{also}{made}"

    done = [name(r) for r in rows if r.support == "implemented"]
    ignored = [r.flag for r in rows if r.support == "ignored"]
    text = "the draft class implements " + (", ".join(done) or "none of the training flags")
    if ignored:
        text += f" and ignores {', '.join(ignored)}"
        if "embed_requires_grad" in ignored:
            text += " (set_embed gives it the target's embedding unless target_hidden_size differs from hidden_size)"
    later = [f"{r.flag} from {first_sglang_implementing(r.flag)}" for r in rows
             if r.support == "ignored" and first_sglang_implementing(r.flag)]  # fmt: skip
    if later:
        text += f"; later releases implement {', '.join(later)}"
    if version not in SGLANG_DRAFT_READ:
        text += f"; {version}'s own draft class was not read (modelled on the releases read nearest to it)"
    return (
        text + ". The audit reads these flags at the top level of config.json only: eagle_config.norm_before_fc "
        "(which SGLang reads first) and use_aux_norm are not seen"
    )


def _speculators_assumption(version: str) -> str:
    return (
        f"SGLang {version} has no reader for the speculators format: a speculators checkpoint is audited as a hand "
        "conversion that flattens transformer_layer_config, sets architectures [LlamaForCausalLMEagle3] and keeps "
        "tensor names and other top-level keys as they are"
    )


_SGLANG_IDS = (
    "aux ids are read from eagle_config.eagle_aux_hidden_state_layer_ids only; none there -> the target "
    "captures its defaults [2, n//2, n-3] as boundaries (no +1)"
)

SGLANG_0523 = Engine(
    name="sglang",
    version="0.5.23",
    draft_class="LlamaForCausalLMEagle3 (sglang/srt/models/llama_eagle3.py)",
    decoder_prefix="layers",
    legacy_midlayer=True,
    unknown_names_raise=False,
    ids_sources=("eagle_config",),
    fc_aux_count=None,
    speculators_assumptions=(_speculators_assumption("0.5.23"),),
    assumptions=(_SGLANG_IDS,),
    flag_assumptions=(_flag_assumption("0.5.23"),),
)

SGLANG_OLDER = Engine(
    name="sglang",
    version="older",
    draft_class="LlamaForCausalLMEagle3 (sglang/srt/models/llama_eagle3.py, releases before 0.5.14)",
    decoder_prefix="midlayer",
    legacy_midlayer=False,
    unknown_names_raise=False,
    ids_sources=("eagle_config",),
    fc_aux_count=3,
    speculators_assumptions=(_speculators_assumption("before 0.5.14"),),
    assumptions=(
        "SGLang before 0.5.14 expects the decoder layer as midlayer.* and drops layers.0.* without a word",
        "aux ids are read from eagle_config only; DeepSeek targets apply +1 to every id",
    ),
    flag_assumptions=(_flag_assumption("older"),),
)

VLLM = Engine(
    name="vllm",
    version="recent",
    draft_class="Eagle3LlamaForCausalLM (vllm/model_executor/models/llama_eagle3.py)",
    decoder_prefix="layers",
    legacy_midlayer=True,
    unknown_names_raise=True,
    ids_sources=("top_level", "eagle_config"),
    fc_aux_count=3,
    assumptions=(
        "best effort, modelled on vLLM's main branch of 2026: the speculators format is read natively "
        "(nested transformer_layer_config flattened)",
        "unknown checkpoint names raise at load (params_dict[name] / AutoWeightsLoader), so they stop the server instead of being dropped",
        "aux ids are read from the top level first, then eagle_config; the target captures the residual stream "
        "entering layer k (boundary k, speculators' convention); none -> defaults [2, n//2, n-3]",
        "norm_before_residual and norm_before_fc are implemented, the latter as model.input_norm.weight "
        "(name assumed); fc_norm and norm_output were not checked",
        "a draft without embed_tokens or lm_head shares the target's (the target's head has the full vocabulary)",
    ),
)


# SGLang releases whose LlamaForCausalLMEagle3 and its load_weights were read: the name
# mapping is identical in all of them (legacy map midlayer -> layers.0, aux_norm_* ->
# fc_norm.i); which flag norms the class creates differs (rules.conventions.SGLANG_DRAFT_FLAGS).
SGLANG_LOADER_READ = SGLANG_DRAFT_READ
_VERSION = re.compile(r"^\d+\.\d+\.\d+([.+\-]?[0-9A-Za-z.+\-]*)?$")


def sglang_release(version: str) -> Engine:
    """SGLang at one release: the loader model (the same in every release read), that
    release's draft flags (``rules.conventions.SGLANG_DRAFT_FLAGS``) and its capture rules
    (``rules.conventions.SGLANG_CAPTURE``)."""
    if not _VERSION.match(version):
        raise ValueError(f"unknown SGLang version {version!r} (a release such as 0.5.17)")
    if version_tuple(version) < version_tuple(SGLANG_LOADER_READ[0]):
        # The loader before the first release read knows midlayer.* only: that one model.
        unread = (
            f"SGLang {version}'s own loader was not read: it is modelled as the midlayer-only loader "
            f"of the releases before {SGLANG_LOADER_READ[0]}"
        )
        return replace(SGLANG_OLDER, release=version, assumptions=(unread, *SGLANG_OLDER.assumptions))
    read = version in SGLANG_LOADER_READ
    note = (
        f"the draft loader is modelled on every release from {SGLANG_LOADER_READ[0]} to {SGLANG_LOADER_READ[-1]} "
        "(its name mapping is identical in all of them)" + ("" if read else f"; {version}'s own was not read")
    )
    return replace(
        SGLANG_0523,
        version=version,
        draft_class=f"LlamaForCausalLMEagle3 (sglang/srt/models/llama_eagle3.py, {version})",
        speculators_assumptions=(_speculators_assumption(version),),
        assumptions=(note, _SGLANG_IDS),
        flag_assumptions=(_flag_assumption(version),),
    )


def parse_engine(spec: str) -> tuple[str, str | None]:
    """``sglang``, ``vllm``, ``sglang==VERSION`` or ``vllm==VERSION`` -> (name, version or None)."""
    name, sep, version = spec.partition("==")
    name = name.strip().lower()
    if name not in ("sglang", "vllm"):
        raise ValueError(f"invalid choice: {spec!r} (choose from sglang, vllm, sglang==VERSION, vllm==VERSION)")
    if sep and not version.strip():
        raise ValueError(f"{spec!r}: no version after '=='")
    return name, (version.strip() if sep else None)


def vllm_engine(version: str) -> Engine:
    """vLLM at one release, from ``rules.vllm`` (read from its source): what a CUDA server runs
    by default, Model Runner V2. The audit of such an engine is ``checks.vllm_audit``."""
    if not _VERSION.match(version):
        raise ValueError(f"unknown vLLM version {version!r} (a release such as {VLLM_READ[-1]})")
    rel = vllm_release(version)
    read = "" if rel.read else f"; {version} itself was not read (modelled on {', '.join(VLLM_READ)})"
    return replace(
        VLLM,
        version=version,
        draft_class=f"Eagle3LlamaForCausalLM (vllm/model_executor/models/llama_eagle3.py, {version})",
        assumptions=(
            f"modelled on vLLM {', '.join(VLLM_READ)}'s source{read}: the speculators format is read natively",
            "the runner is Model Runner V2, what a CUDA server runs by default: it reads top-level "
            "eagle_aux_hidden_state_layer_ids, then dflash_config.target_layer_ids + 1, dspark_target_layer_ids, "
            "top-level target_layer_ids + 1, then dflash_config.layer_ids / eagle_config.layer_ids, and not "
            "eagle_config.eagle_aux_hidden_state_layer_ids; VLLM_USE_V2_MODEL_RUNNER=0 (and vLLM's CPU build) run "
            "the V1 runner, which reads that one too",
            "the draft class is the one vLLM's registry gives the config's architectures (Eagle3Qwen3ForCausalLM, "
            "Eagle3DeepseekV2ForCausalLM, else Eagle3LlamaForCausalLM); the training flags it does not read are findings",
            "the target captures id k as boundary k (0 = the embedding, n = the last layer's output; others are dropped "
            "without a word), distinct ids in ascending order; no ids -> defaults (2, n//2, n-3)",
            "unknown checkpoint names raise at load, except '.bias' tensors, which AutoWeightsLoader ignores without a word",
            "a draft without embed_tokens or lm_head shares the target's",
        ),
    )


def get_engine(name: str, version: str | None = None) -> Engine:
    """``sglang`` (0.5.23 by default, a release such as ``0.5.17``; a release before 0.5.14, or
    ``older``, is the midlayer-only loader) or ``vllm``
    (best effort, or a release such as ``0.32.0``)."""
    if name == "vllm":
        if version is not None:
            return vllm_engine(version)
        return VLLM
    if name == "sglang":
        if version in (None, "0.5.23"):
            return SGLANG_0523
        if version == "older":
            return SGLANG_OLDER
        return sglang_release(version)
    raise ValueError(f"unknown engine {name!r} (known: sglang, vllm)")
