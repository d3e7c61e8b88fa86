"""Layer-id conventions: who means what by "capture layer k".

Canonical index **b** is Hugging Face ``hidden_states[b]``: b=0 is the embedding output,
b=k the output of block k-1 (the input of block k). Every capture list spectrace reports
is in boundaries, so ids written under different conventions can be compared.

    >>> engine_boundaries([2, 30, 58], "sglang_deepseek_old", 61).boundaries
    [3, 31, 59]

What each SGLang release does with a capture list (its rule, whether it can capture the
embedding, whether a short capture crashes) is one table, :data:`SGLANG_CAPTURE`, read by
the runtime check and by the audit alike:

    >>> sglang_capture_facts("LlamaForCausalLM", "0.5.17").embedding
    'crash'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Convention = Literal[
    "speculators",  # speculators / vLLM: id k is boundary k (0 = embedding)
    "specforge",  # SpecForge: id k is the output of block k, boundary k+1
    "sglang_llama",  # SGLang Llama target: boundary k+1, -1 = embedding, ids past the end dropped silently
    "sglang_deepseek_old",  # SGLang DeepSeek before 0.5.23: always +1
    "sglang_deepseek",  # SGLang DeepSeek 0.5.23: +1 only when the first id is 1, otherwise literal
    "sglang_gpt_oss",  # SGLang GPT-OSS: literal boundaries when the largest id is the layer count, else +1
]
CONVENTIONS: tuple[str, ...] = (
    "speculators",
    "specforge",
    "sglang_llama",
    "sglang_deepseek_old",
    "sglang_deepseek",
    "sglang_gpt_oss",
)
TRAINER_CONVENTIONS: tuple[str, ...] = ("speculators", "specforge")


@dataclass(frozen=True)
class CaptureResult:
    """The boundaries an engine really captures for the ids it was given."""

    ids: list[int]
    boundaries: list[int]
    convention: str
    num_layers: int
    dropped_ids: list[int] = field(default_factory=list)
    error: str | None = None

    @property
    def short(self) -> bool:
        return len(self.boundaries) < len(self.ids)


def trainer_boundaries(ids: Sequence[int], convention: str) -> list[int]:
    """Boundaries a trainer means by ``ids`` (what the draft was trained on)."""
    if convention == "speculators":
        return [int(i) for i in ids]
    if convention == "specforge":
        return [int(i) + 1 for i in ids]
    raise ValueError(f"{convention!r} is not a trainer convention ({', '.join(TRAINER_CONVENTIONS)})")


def engine_boundaries(ids: Sequence[int], convention: str, num_layers: int) -> CaptureResult:
    """Boundaries a serving engine captures for ``ids`` on an ``num_layers`` target.

    Mirrors the engines' own loops: SGLang captures the residual stream entering layer
    i for each i in its (shifted) set, walking layers in order, so the result is sorted,
    de-duplicated, and an i outside ``[0, num_layers)`` is never reached.
    """
    ids = [int(i) for i in ids]
    if convention in TRAINER_CONVENTIONS:
        wanted = trainer_boundaries(ids, convention)
        kept = [b for b in wanted if 0 <= b <= num_layers]
        dropped = [i for i, b in zip(ids, wanted) if not 0 <= b <= num_layers]
        return CaptureResult(ids, kept, convention, num_layers, dropped)
    if convention in ("sglang_llama", "sglang_deepseek_old"):
        shifted = {i + 1 for i in ids}
        kept = [b for b in range(num_layers) if b in shifted]
        dropped = [i for i in ids if not 0 <= i + 1 < num_layers]
        return CaptureResult(ids, kept, convention, num_layers, dropped)
    if convention == "sglang_deepseek":
        shift = 1 if ids and ids[0] == 1 else 0
        shifted_set = {i + shift for i in ids}
        kept = [b for b in range(num_layers) if b in shifted_set]
        error = None
        if len(kept) != len(ids):
            error = f"captured {len(kept)} of {len(ids)} aux hidden states"
        dropped = [i for i in ids if not 0 <= i + shift < num_layers]
        return CaptureResult(ids, kept, convention, num_layers, dropped, error)
    if convention == "sglang_gpt_oss":
        # models/gpt_oss.py: ids whose largest is the layer count are boundaries already (the
        # last one captured at the final norm, GptOssModel.forward); any other list gets +1.
        literal = bool(ids) and max(ids) == num_layers
        wanted_set = set(ids) if literal else {i + 1 for i in ids}
        kept = [b for b in range(num_layers + 1) if b in wanted_set]
        shift = 0 if literal else 1
        dropped = [i for i in ids if not 0 <= i + shift <= num_layers]
        return CaptureResult(ids, kept, convention, num_layers, dropped)
    raise ValueError(f"unknown convention {convention!r}; known: {', '.join(CONVENTIONS)}")


def default_ids(convention: str, num_layers: int) -> list[int]:
    """The ids a trainer or engine uses when none are configured."""
    n = num_layers
    if convention == "specforge":
        return [1, n // 2 - 1, n - 4]
    # speculators, vLLM and SGLang (taken literally) all write [2, n//2, n-3].
    return [2, n // 2, n - 3]


# ------------------------------------------------------------------ SGLang, by release
#
# One table of what each SGLang release does with a capture list, read from the
# released wheels (paths under python/sglang/srt/). Both the runtime check
# (integrations/sglang) and the offline audit (``spectrace audit --engine sglang==V``)
# read it, so they give the same finding for the same release.

SGLangFamily = Literal["llama", "deepseek", "plus_one", "deepseek_rule", "gpt_oss", "minimax_m3_vl"]
Support = Literal["captured", "crash", "unknown"]  # what a request for the embedding does


def release_in(version: str, since: str | None, before: str | None) -> bool:
    """Whether ``version`` lies in ``[since, before)`` (None: open on that side)."""
    v = version_tuple(version)
    return (since is None or v >= version_tuple(since)) and (before is None or v < version_tuple(before))


def release_span(since: str | None, before: str | None) -> str:
    if since and before:
        return f"{since} <= version < {before}"
    if since:
        return f">= {since}"
    return f"< {before}" if before else "every version"


@dataclass(frozen=True)
class SGLangCaptureFacts:
    """What one SGLang target family does with its capture list in a range of releases.

    ``since`` is the first release the row covers (None: every earlier one), ``before`` the
    first it no longer covers (None: every later one).
    """

    family: SGLangFamily
    since: str | None
    before: str | None
    rule: str  # the id -> boundary convention of set_eagle3_layers_to_capture
    embedding: Support  # asked for boundary 0 (the embedding output)
    embedding_how: str  # why, with source lines
    embedding_ids: str  # which ids ask for the embedding under this rule
    short: Literal["silent", "raises", "unknown"]  # fewer layers reached than ids given
    short_how: str
    read_in: tuple[str, ...]  # the releases this row was read from (or checked on)

    def covers(self, version: str) -> bool:
        return release_in(version, self.since, self.before)

    @property
    def span(self) -> str:
        return release_span(self.since, self.before)


_LLAMA_CRASH = (
    "models/llama.py::LlamaModel.forward appends `hidden_states + residual` before running layer i, and "
    "before layer 0 the residual is still None (0.5.14 l.409, 0.5.17 l.437, 0.5.20 l.442, 0.5.21 l.441): "
    "TypeError at the first forward; on a server that is the prefill CUDA-graph capture, after which "
    "SGLang kills its process tree without another word"
)
_LLAMA_OK = (
    "layers/layer_boundary/stage.py::_prepare_attention captures the embedding itself while the residual "
    "stream is still empty (0.5.22 l.354-367, 0.5.23 l.421-434); checked on CPU with 0.5.23"
)
_LLAMA_SHORT = "the capture loop never reaches an index past the last layer and captures fewer chunks, without a word"
_DEEPSEEK_RAISES = (
    "AuxHiddenStatePacker.finalize raises 'captured N of M aux hidden states' at the first forward "
    "(layers/aux_hidden_states.py: an assert in 0.5.17 l.45-47, RuntimeError in 0.5.23 l.86-89; checked on CPU with 0.5.23)"
)
_DEEPSEEK_OK = (
    "the capture after prepare_attn takes the residual, which before layer 0 is the embedding "
    "(layers/communicator.py::prepare_attn_and_capture_last_layer_outputs: 0.5.14 l.488-516 with l.557, 0.5.17 "
    "l.505-534 with l.576; 0.5.23 layer_boundary/stage.py::_prepare_attention); checked on CPU with 0.5.23"
)

SGLANG_CAPTURE: tuple[SGLangCaptureFacts, ...] = (
    SGLangCaptureFacts(
        "llama",
        None,
        "0.5.14",
        "sglang_llama",
        "unknown",
        "not read from a release before 0.5.14; 0.5.14 to 0.5.21 crash (" + _LLAMA_CRASH + ")",
        "-1 (the +1 rule makes it layers_to_capture 0)",
        "unknown",
        "not read",
        (),
    ),
    SGLangCaptureFacts(
        "llama",
        "0.5.14",
        "0.5.22",
        "sglang_llama",
        "crash",
        _LLAMA_CRASH,
        "-1 (the +1 rule makes it layers_to_capture 0)",
        "silent",
        _LLAMA_SHORT,
        ("0.5.14", "0.5.17", "0.5.20", "0.5.21"),
    ),
    SGLangCaptureFacts(
        "llama",
        "0.5.22",
        None,
        "sglang_llama",
        "captured",
        _LLAMA_OK,
        "-1 (the +1 rule makes it layers_to_capture 0)",
        "silent",
        _LLAMA_SHORT,
        ("0.5.22", "0.5.23"),
    ),
    SGLangCaptureFacts(
        # The always-+1 rule reported for releases before 0.5.14; no wheel of it was read.
        "deepseek",
        None,
        "0.5.14",
        "sglang_deepseek_old",
        "unknown",
        "not read from a release before 0.5.14",
        "-1 (always +1)",
        "unknown",
        "not read",
        (),
    ),
    SGLangCaptureFacts(
        "deepseek",
        "0.5.14",
        "0.5.17",
        "sglang_deepseek",
        "captured",
        _DEEPSEEK_OK,
        "0 when the first id is not 1 (-1 is never reached)",
        "unknown",
        "not read (no AuxHiddenStatePacker yet)",
        ("0.5.14",),
    ),
    SGLangCaptureFacts(
        "deepseek",
        "0.5.17",
        None,
        "sglang_deepseek",
        "captured",
        _DEEPSEEK_OK,
        "0 when the first id is not 1 (-1 is never reached)",
        "raises",
        _DEEPSEEK_RAISES,
        ("0.5.17", "0.5.20", "0.5.21", "0.5.22", "0.5.23"),
    ),
    # The other EAGLE-3 targets, read from every set_eagle3_layers_to_capture of 0.5.17 and
    # 0.5.23 (models/*.py): the same rule in both. Their forwards were not read for the
    # embedding, so what a request for boundary 0 does there stays unknown.
    SGLangCaptureFacts(
        "plus_one",
        None,
        None,
        "sglang_llama",
        "unknown",
        "not read: this target's own forward decides what it captures before layer 0",
        "-1 (the +1 rule makes it layers_to_capture 0)",
        "unknown",
        "Qwen2-MoE, Qwen3-MoE and Qwen3-Next index self.layers[i] for each i and raise IndexError past the end "
        "(models/qwen3_moe.py::Qwen3MoeModel.set_eagle3_layers_to_capture); the others skip it without a word",
        ("0.5.17", "0.5.23"),
    ),
    SGLangCaptureFacts(
        "deepseek_rule",
        None,
        None,
        "sglang_deepseek",
        "unknown",
        "not read: this target's own forward decides what it captures before layer 0",
        "0 when the first id is not 1 (-1 is never reached)",
        "unknown",
        "not read",
        ("0.5.17", "0.5.23"),
    ),
    SGLangCaptureFacts(
        "gpt_oss",
        None,
        None,
        "sglang_gpt_oss",
        "unknown",
        "not read: GptOssModel.forward captures boundary i at layer i and the last one at the final norm",
        "-1 (ids are +1 unless the largest equals the layer count), or 0 among boundary ids",
        "silent",
        "the capture loop never reaches an index past the final norm and captures fewer chunks, without a word",
        ("0.5.17", "0.5.23"),
    ),
    SGLangCaptureFacts(
        "minimax_m3_vl",
        "0.5.23",
        None,
        "sglang_llama",
        "unknown",
        "not read: MiniMaxM3Model.forward captures at each marked layer's entry",
        "-1 (+1 is applied to SGLang's defaults too: [3, n//2+1, n-2] when no ids are given)",
        "silent",
        "only layers inside the model are marked (_is_layer_to_capture); others are skipped without a word",
        ("0.5.23",),
    ),
)
# Every class that defines set_eagle3_layers_to_capture(layer_ids) in SGLang 0.5.17 or 0.5.23
# (models/*.py), by family. Subclasses are found through their ancestry; the wrappers that
# only delegate to their language model (Gemma-3 and Llama-4 multimodal, MindSpore, Kimi-K2.5)
# are named by what they wrap.
SGLANG_TARGET_FAMILIES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "DeepseekV2ForCausalLM": "deepseek",
    "DeepseekV3ForCausalLM": "deepseek",
    "KimiK25ForConditionalGeneration": "deepseek",
    "Glm4MoeLiteForCausalLM": "deepseek_rule",
    "GptOssForCausalLM": "gpt_oss",
    "MiniMaxM3SparseForConditionalGeneration": "minimax_m3_vl",
    **{
        name: "plus_one"
        for name in (
            "ApertusForCausalLM", "BailingMoEForCausalLM", "ExaoneMoEForCausalLM", "Gemma3ForCausalLM",
            "Gemma4ForCausalLM", "Gemma4ForConditionalGeneration", "Glm4MoeForCausalLM", "Glm5NextForConditionalGeneration",
            "LongcatFlashForCausalLM", "MiniMaxM2ForCausalLM", "MiniMaxM3SparseForCausalLM", "Qwen2ForCausalLM",
            "Qwen2_5_VLForConditionalGeneration", "Qwen2MoeForCausalLM", "Qwen3ForCausalLM", "Qwen3_5ForCausalLM",
            "Qwen3MoeForCausalLM", "Qwen3NextForCausalLM", "Qwen3VLForConditionalGeneration",
        )
    },
}  # fmt: skip
# The release whose rules apply when the version is unknown.
SGLANG_LATEST_READ = "0.5.23"


def sglang_family(architecture: str | Sequence[str]) -> str | None:
    """The target family of a class name (or a class's MRO names, most derived first).

    ``llama`` is SGLang's ``models/llama.py::LlamaForCausalLM`` and its subclasses (which run
    its ``LlamaModel``); ``deepseek`` is DeepSeek V2/V3 and Kimi-K2.5 (which delegates to
    it); the others as :data:`SGLANG_TARGET_FAMILIES` says. Any other name: None (the rule
    is unknown; the capture's observed boundaries are what counts).
    """
    names = [architecture] if isinstance(architecture, str) else list(architecture)
    for name in names:
        if name in SGLANG_TARGET_FAMILIES:
            return SGLANG_TARGET_FAMILIES[name]
        low = name.lower()
        if "deepseek" in low or "kimi" in low:
            return "deepseek"
    return None


def sglang_capture_facts(architecture: str | Sequence[str], version: str | None) -> SGLangCaptureFacts | None:
    """The row of :data:`SGLANG_CAPTURE` for this target and release (None: family unknown)."""
    return sglang_family_facts(sglang_family(architecture), version)


def sglang_family_facts(family: str | None, version: str | None) -> SGLangCaptureFacts | None:
    """The row of :data:`SGLANG_CAPTURE` for a family and release (None: family unknown)."""
    if family is None:
        return None
    version = version or SGLANG_LATEST_READ
    for row in SGLANG_CAPTURE:
        if row.family == family and row.covers(version):
            return row
    return None


def first_sglang_capturing_embedding(family: str) -> str | None:
    """The first release known to capture the embedding for ``family`` (None: every read one does)."""
    rows = [r for r in SGLANG_CAPTURE if r.family == family and r.embedding == "captured"]
    if not rows:
        return None
    return rows[0].since


def engine_rule(architecture: str | Sequence[str], sglang_version: str | None = None) -> str:
    """The capture convention SGLang applies for a target architecture (from :data:`SGLANG_CAPTURE`).

    ``architecture`` is a class name or a class's MRO names (most derived first).
    Names outside the table's families get the Llama rule, the +1 most SGLang targets apply
    (:func:`sglang_rule_known` says whether that is a guess).
    """
    facts = sglang_capture_facts(architecture, sglang_version)
    return facts.rule if facts is not None else "sglang_llama"


def sglang_rule_known(architecture: str | Sequence[str]) -> bool:
    """Whether SGLang's id rule for this target class was read (its family is in the table)."""
    return sglang_family(architecture) is not None


def sglang_default_ids(architecture: str | Sequence[str], num_layers: int) -> list[int]:
    """What SGLang's target captures (as ``layers_to_capture``) when given no ids: [2, n//2, n-3]
    literally, except MiniMax-M3-VL, which adds +1 to them too (models/minimax_m3_vl.py, 0.5.23)."""
    ids = default_ids("speculators", num_layers)
    return [i + 1 for i in ids] if sglang_family(architecture) == "minimax_m3_vl" else ids


def version_tuple(version: str) -> tuple[int, ...]:
    """``"0.5.15.post1"`` -> ``(0, 5, 15)``: the release's first three numbers (missing ones are 0)."""
    parts: list[int] = []
    for piece in version.split(".")[:3]:
        digits = ""
        for ch in piece:  # "23rc1", "15+cu128": the leading digits only
            if not ch.isdigit():
                break
            digits += ch
        parts.append(int(digits) if digits else 0)
    while len(parts) < 3:
        parts.append(0)
    return tuple(parts)


# ------------------------------------------------------------------ SGLang draft flags, by release
#
# What each SGLang release's EAGLE-3 draft class (models/llama_eagle3.py::
# LlamaForCausalLMEagle3) does with the training flags of a draft config, read from the
# released wheels 0.5.14 to 0.5.23 (every release of that range; 0.5.23 from its
# installed source). The offline audit (the flags it reports, the parameters it expects
# the draft class to create) and the runtime check (checks.capture.check_config_flags)
# both read this table, so they make the same claim for the same release.

FlagSupport = Literal["implemented", "ignored", "unknown"]
# The releases whose llama_eagle3.py was read: the draft class and its load_weights.
SGLANG_DRAFT_READ: tuple[str, ...] = (
    "0.5.14", "0.5.15", "0.5.16", "0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23",
)  # fmt: skip


@dataclass(frozen=True)
class SGLangDraftFlag:
    """What the draft class of a range of SGLang releases does with one training flag.

    ``since`` / ``before`` as in :class:`SGLangCaptureFacts`. ``keys`` are the config keys
    the release reads, in its order (``eagle_config.X``: inside eagle_config); with
    ``any_key`` any of them set turns the flag on, otherwise the first one present decides.
    ``params`` are the parameters the class then creates (``{i}``: one per aux state).
    ``severity`` and ``effect`` say what goes wrong when the flag is set and ignored;
    ``kept_if_target_hidden_differs``: not ignored when the draft's target_hidden_size
    differs from its hidden_size (see :func:`sglang_flag_applies`).
    """

    flag: str
    since: str | None
    before: str | None
    support: FlagSupport
    how: str  # what the release does with it, with source lines
    read_in: tuple[str, ...]
    severity: str = "error"
    effect: str = ""
    keys: tuple[str, ...] = ()
    any_key: bool = False
    params: tuple[str, ...] = ()
    kept_if_target_hidden_differs: bool = False

    def covers(self, version: str) -> bool:
        return release_in(version, self.since, self.before)

    @property
    def span(self) -> str:
        return release_span(self.since, self.before)

    def read(self, version: str) -> bool:
        """Whether this very release was read (not only the range around it)."""
        return version in self.read_in


_ALL = SGLANG_DRAFT_READ
_NOT_READ = "not read: spectrace has read no draft class of a release before 0.5.14"
_NBR_EFFECT = (
    "the draft was trained with the residual taken after hidden_norm; SGLang's decoder layer takes it before, "
    "so every draft step runs a different function than the one trained"
)
_NBF_EFFECT = "the draft was trained with an RMSNorm over the fused aux states before fc; SGLang feeds them to fc raw"
_FCN_EFFECT = "the draft was trained with a per-chunk RMSNorm before fc; SGLang feeds the chunks raw"
_NOUT_EFFECT = (
    "the draft was trained feeding post-norm hidden states to its next step; SGLang feeds the pre-norm ones, "
    "so draft steps after the first see other inputs"
)
_EMB_EFFECT = (
    "the draft trained its own embedding, but SGLang replaces embed_tokens with the target's at start-up (set_embed), discarding it"
)
_NBF: dict[str, Any] = {
    "severity": "error", "effect": _NBF_EFFECT, "keys": ("eagle_config.norm_before_fc", "norm_before_fc"),
    "params": ("model.input_norm.weight",),
}  # fmt: skip
_FCN: dict[str, Any] = {
    "severity": "error", "effect": _FCN_EFFECT, "keys": ("fc_norm", "use_aux_norm"), "any_key": True,
    "params": ("model.fc_norm.{i}.weight",),
}  # fmt: skip
_NOUT: dict[str, Any] = {"severity": "warning", "effect": _NOUT_EFFECT, "keys": ("norm_output",)}
_NBR: dict[str, Any] = {"severity": "error", "effect": _NBR_EFFECT, "keys": ("norm_before_residual",)}
_EMB: dict[str, Any] = {
    "severity": "warning", "effect": _EMB_EFFECT, "keys": ("embed_requires_grad",),
    "kept_if_target_hidden_differs": True,
}  # fmt: skip

SGLANG_DRAFT_FLAGS: tuple[SGLangDraftFlag, ...] = (
    SGLangDraftFlag("norm_before_fc", None, "0.5.14", "unknown", _NOT_READ, (), **_NBF),
    SGLangDraftFlag(
        "norm_before_fc",
        "0.5.14",
        "0.5.17",
        "ignored",
        "never read: LlamaModel builds fc and fc_norm but no input_norm and feeds fc the fused states without it "
        "(models/llama_eagle3.py, 0.5.14 to 0.5.16 l.155-183 and l.213-221)",
        ("0.5.14", "0.5.15", "0.5.16"),
        **_NBF,
    ),
    SGLangDraftFlag(
        "norm_before_fc",
        "0.5.17",
        None,
        "implemented",
        "LlamaModel.__init__ reads eagle_config.norm_before_fc, else the top-level norm_before_fc, and builds "
        "model.input_norm = RMSNorm(num_aux x target_hidden_size) (models/llama_eagle3.py, 0.5.17 to 0.5.21 "
        "l.161-174, 0.5.22 l.168-181, 0.5.23 l.169-182); forward normalises the fused states before fc "
        "(0.5.17 to 0.5.21 l.230-231, 0.5.22 l.238-239, 0.5.23 l.239-240); load_weights maps input_norm.weight "
        "to it like any other name",
        ("0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23"),
        **_NBF,
    ),
    SGLangDraftFlag("fc_norm", None, "0.5.14", "unknown", _NOT_READ, (), **_FCN),
    SGLangDraftFlag(
        "fc_norm",
        "0.5.14",
        None,
        "implemented",
        "LlamaModel.__init__ builds model.fc_norm, one RMSNorm(target_hidden_size) per aux state, when config.fc_norm "
        "or the legacy config.use_aux_norm is set (top level only; models/llama_eagle3.py, 0.5.14 to 0.5.16 "
        "l.161-173, 0.5.17 to 0.5.21 l.176-188, 0.5.22 l.183-195, 0.5.23 l.184-196); forward normalises each chunk "
        "before fc (0.5.14 to 0.5.16 l.215-220, 0.5.17 to 0.5.21 l.232-237, 0.5.22 l.240-245, 0.5.23 l.241-246); "
        "load_weights maps the legacy aux_norm_low/mid/high to fc_norm.0/1/2 (0.5.14 to 0.5.16 l.310-315, "
        "0.5.17 to 0.5.21 l.327-332, 0.5.22 l.335-340, 0.5.23 l.338-343)",
        _ALL,
        **_FCN,
    ),
    SGLangDraftFlag("norm_output", None, "0.5.14", "unknown", _NOT_READ, (), **_NOUT),
    SGLangDraftFlag(
        "norm_output",
        "0.5.14",
        None,
        "implemented",
        "config.norm_output makes the draft hand its post-norm hidden state to the next step (no parameter; "
        "models/llama_eagle3.py, 0.5.14 to 0.5.16 l.183 and l.242, 0.5.17 to 0.5.21 l.198 and l.259, 0.5.22 l.206 "
        "and l.267, 0.5.23 l.207 and l.268)",
        _ALL,
        **_NOUT,
    ),
    SGLangDraftFlag("norm_before_residual", None, "0.5.14", "unknown", _NOT_READ, (), **_NBR),
    SGLangDraftFlag(
        "norm_before_residual",
        "0.5.14",
        None,
        "ignored",
        "never read anywhere in the package; the draft's layer 0 takes its residual before hidden_norm "
        "(models/llama_eagle3.py::LlamaDecoderLayer.forward, 0.5.14 to 0.5.21 l.91-92, 0.5.22 l.98-99, 0.5.23 l.99-100)",
        _ALL,
        **_NBR,
    ),
    SGLangDraftFlag("embed_requires_grad", None, "0.5.14", "unknown", _NOT_READ, (), **_EMB),
    SGLangDraftFlag(
        "embed_requires_grad",
        "0.5.14",
        None,
        "ignored",
        "never read anywhere in the package; the EAGLE-3 worker hands the draft the target's embedding "
        "(speculative/eagle_worker_v2.py set_embed / set_embed_and_head: 0.5.14 l.327-329, 0.5.15 l.348-351, "
        "0.5.16 l.327-330, 0.5.17 l.292-295, 0.5.18 l.300-303, 0.5.19 l.308-311, 0.5.20 l.342-345, 0.5.21 "
        "l.349-352, 0.5.22 l.340-343, 0.5.23 l.360-363); set_embed keeps the draft's own only when "
        "target_hidden_size differs from hidden_size (models/llama.py::set_embed: 0.5.14 l.793-799, 0.5.17 "
        "l.866-872, 0.5.22 l.903-909, 0.5.23 l.910-916), set_embed_and_head (a draft without draft_vocab_size, "
        "whose head comes from the target) replaces it always (models/llama.py: 0.5.14 l.778-782, 0.5.17 "
        "l.851-855, 0.5.22 l.888-892, 0.5.23 l.895-899)",
        _ALL,
        **_EMB,
    ),
)
SGLANG_DRAFT_FLAG_NAMES: tuple[str, ...] = tuple(dict.fromkeys(row.flag for row in SGLANG_DRAFT_FLAGS))


def sglang_draft_flag(flag: str, version: str | None) -> SGLangDraftFlag | None:
    """The row of :data:`SGLANG_DRAFT_FLAGS` for a flag and release (None: a flag the table does not know).

    ``version`` None: the latest release read (:data:`SGLANG_LATEST_READ`).
    """
    version = version or SGLANG_LATEST_READ
    for row in SGLANG_DRAFT_FLAGS:
        if row.flag == flag and row.covers(version):
            return row
    return None


def sglang_flag_everywhere(flag: str) -> FlagSupport | None:
    """What every release read does with ``flag``, when they all agree (None: they differ or it is unknown)."""
    seen = {row.support for row in SGLANG_DRAFT_FLAGS if row.flag == flag and row.read_in}
    return next(iter(seen)) if len(seen) == 1 else None


def first_sglang_implementing(flag: str) -> str | None:
    """The first release read whose draft class implements ``flag`` (None: none does)."""
    rows = [r for r in SGLANG_DRAFT_FLAGS if r.flag == flag and r.support == "implemented" and r.read_in]
    return rows[0].since if rows else None


def sglang_flag_value(row: SGLangDraftFlag, config: Mapping[str, Any]) -> bool:
    """Whether the release of ``row`` sees the flag on in a draft config mapping (its keys, in its order)."""
    eagle = config.get("eagle_config")
    eagle = eagle if isinstance(eagle, Mapping) else {}
    found: list[Any] = []
    for key in row.keys:
        scope, _, name = key.rpartition(".")
        where = eagle if scope == "eagle_config" else config
        if name in where:
            found.append(where[name])
    if row.any_key:
        return any(bool(v) for v in found)
    return bool(found[0]) if found else False


def sglang_flag_applies(row: SGLangDraftFlag, hidden_size: Any, target_hidden_size: Any, *, head_from_target: bool = False) -> bool:
    """Whether an ignored flag really goes unhonoured for this draft: set_embed keeps the draft's
    embedding when target_hidden_size differs from hidden_size, unless the head comes from the
    target (no draft_vocab_size, untied: set_embed_and_head replaces both)."""
    if row.kept_if_target_hidden_differs and target_hidden_size is not None and not head_from_target:
        return target_hidden_size == hidden_size
    return True
