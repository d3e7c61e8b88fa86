"""What each serving engine's EAGLE-3 draft class expects, and how it maps checkpoint names.

Each engine is modelled from its source: the parameters the draft class creates
(names and shapes for a given config), the ``load_weights`` name mapping replayed on
the checkpoint's names, where it reads the aux layer ids and which capture rule its
target applies. Nothing here imports an engine.

    >>> eng = get_engine("sglang", "0.5.23")
    >>> cfg = read_checkpoint(Path("tests/fixtures/specforge_tiny")).config
    >>> eng.route("midlayer.self_attn.q_proj.weight", eng.params(dims_of(cfg)))
    Route(kind='param', param='model.layers.0.self_attn.qkv_proj.weight', shard='q', note='')
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Literal

from ..rules.conventions import engine_rule, version_tuple
from .checkpoint import DraftConfig

RouteKind = Literal["param", "special", "skipped", "dropped"]

# (fused param, checkpoint shard name, shard id): the same table in SGLang and vLLM.
STACKED = (
    (".qkv_proj", ".q_proj", "q"),
    (".qkv_proj", ".k_proj", "k"),
    (".qkv_proj", ".v_proj", "v"),
    (".gate_up_proj", ".gate_proj", 0),
    (".gate_up_proj", ".up_proj", 1),
)


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
    )


@dataclass(frozen=True)
class Param:
    """One engine parameter: its full shape, the shape each shard of it takes, and why it may stay unwritten."""

    name: str
    shape: tuple[int, ...]
    shards: dict[object, tuple[int, ...]] | None = None
    optional: str | None = None


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
    fc_aux_count: int | None  # SGLang builds fc for exactly 3 aux states
    assumptions: tuple[str, ...] = field(default=())

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
        aux = self.fc_aux_count or 3
        add("model.fc.weight", (h, aux * d.target_hidden))
        if d.fc_bias:
            add("model.fc.bias", (h,))
        if d.norm_before_fc and self.name == "vllm":
            add("model.input_norm.weight", (aux * d.target_hidden,))
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
        if self.legacy_midlayer and "midlayer." in name:
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


SGLANG_0523 = Engine(
    name="sglang",
    version="0.5.23",
    draft_class="LlamaForCausalLMEagle3 (sglang/srt/models/llama_eagle3.py)",
    decoder_prefix="layers",
    legacy_midlayer=True,
    unknown_names_raise=False,
    ids_sources=("eagle_config",),
    fc_aux_count=3,
    assumptions=(
        "SGLang 0.5.23 has no reader for the speculators format: a speculators checkpoint is audited as a hand "
        "conversion that flattens transformer_layer_config, sets architectures [LlamaForCausalLMEagle3] and keeps "
        "tensor names and other top-level keys as they are",
        "aux ids are read from eagle_config.eagle_aux_hidden_state_layer_ids only; none there -> the target "
        "captures its defaults [2, n//2, n-3] as boundaries (no +1)",
        "the draft class has no input_norm / fc_norm modules and ignores norm_before_residual, norm_before_fc, "
        "fc_norm and norm_output",
    ),
)

SGLANG_OLDER = Engine(
    name="sglang",
    version="older",
    draft_class="LlamaForCausalLMEagle3 (sglang/srt/models/llama_eagle3.py, releases before 0.5.23)",
    decoder_prefix="midlayer",
    legacy_midlayer=False,
    unknown_names_raise=False,
    ids_sources=("eagle_config",),
    fc_aux_count=3,
    assumptions=(
        "older SGLang expects the decoder layer as midlayer.* and drops layers.0.* without a word",
        "aux ids are read from eagle_config only; DeepSeek targets apply +1 to every id",
    ),
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
        "unknown checkpoint names raise at load (params_dict[name] / AutoWeightsLoader), so they stop the server "
        "instead of being dropped",
        "aux ids are read from the top level first, then eagle_config; the target captures the residual stream "
        "entering layer k (boundary k, speculators' convention); none -> defaults [2, n//2, n-3]",
        "norm_before_residual and norm_before_fc are implemented, the latter as model.input_norm.weight "
        "(name assumed); fc_norm and norm_output were not checked",
        "a draft without embed_tokens or lm_head shares the target's (the target's head has the full vocabulary)",
    ),
)


# SGLang releases whose LlamaForCausalLMEagle3.load_weights was read: identical in all of
# them (legacy map midlayer -> layers.0, aux_norm_* -> fc_norm.i), the one SGLANG_0523 models.
SGLANG_LOADER_READ = ("0.5.14", "0.5.17", "0.5.20", "0.5.21", "0.5.22", "0.5.23")
_VERSION = re.compile(r"^\d+\.\d+\.\d+([.+\-]?[0-9A-Za-z.+\-]*)?$")


def sglang_release(version: str) -> Engine:
    """SGLang at one release: the 0.5.23 loader model (the same in every release read) with
    that release's capture rules (``eagle3.conventions.SGLANG_CAPTURE``)."""
    if not _VERSION.match(version):
        raise ValueError(f"unknown SGLang version {version!r} (a release such as 0.5.17, or 'older')")
    if version_tuple(version) < version_tuple(SGLANG_LOADER_READ[0]):
        raise ValueError(
            f"SGLang {version}: spectrace has read the draft loader of {SGLANG_LOADER_READ[0]} to "
            f"{SGLANG_LOADER_READ[-1]} only; use --engine-version older for a loader that knows midlayer.* only"
        )
    read = version in SGLANG_LOADER_READ
    note = (
        f"the draft loader is modelled on {', '.join(SGLANG_LOADER_READ)} (identical in all of them)"
        + ("" if read else f"; {version}'s own was not read")
    )
    return replace(
        SGLANG_0523,
        version=version,
        draft_class=f"LlamaForCausalLMEagle3 (sglang/srt/models/llama_eagle3.py, {version})",
        assumptions=(note, *SGLANG_0523.assumptions[1:]),
    )


def parse_engine(spec: str) -> tuple[str, str | None]:
    """``sglang``, ``vllm`` or ``sglang==VERSION`` -> (name, version or None)."""
    name, sep, version = spec.partition("==")
    name = name.strip().lower()
    if name not in ("sglang", "vllm"):
        raise ValueError(f"invalid choice: {spec!r} (choose from sglang, vllm, sglang==VERSION)")
    if sep and not version.strip():
        raise ValueError(f"{spec!r}: no version after '=='")
    return name, (version.strip() if sep else None)


def get_engine(name: str, version: str | None = None) -> Engine:
    """``sglang`` (0.5.23 by default, ``older``, or a release such as ``0.5.17``) or ``vllm``."""
    if name == "vllm":
        if version is not None:
            raise ValueError("a version applies to --engine sglang only")
        return VLLM
    if name == "sglang":
        if version in (None, "0.5.23"):
            return SGLANG_0523
        if version == "older":
            return SGLANG_OLDER
        return sglang_release(version)
    raise ValueError(f"unknown engine {name!r} (known: sglang, vllm)")
