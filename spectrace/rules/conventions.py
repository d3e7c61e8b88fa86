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

from dataclasses import dataclass, field
from typing import Literal, Sequence

Convention = Literal[
    "speculators",  # speculators / vLLM: id k is boundary k (0 = embedding)
    "specforge",  # SpecForge: id k is the output of block k, boundary k+1
    "sglang_llama",  # SGLang Llama target: boundary k+1, -1 = embedding, ids past the end dropped silently
    "sglang_deepseek_old",  # SGLang DeepSeek before 0.5.23: always +1
    "sglang_deepseek",  # SGLang DeepSeek 0.5.23: +1 only when the first id is 1, otherwise literal
]
CONVENTIONS: tuple[str, ...] = (
    "speculators",
    "specforge",
    "sglang_llama",
    "sglang_deepseek_old",
    "sglang_deepseek",
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
        wanted = {i + shift for i in ids}
        kept = [b for b in range(num_layers) if b in wanted]
        error = None
        if len(kept) != len(ids):
            error = f"captured {len(kept)} of {len(ids)} aux hidden states"
        dropped = [i for i in ids if not 0 <= i + shift < num_layers]
        return CaptureResult(ids, kept, convention, num_layers, dropped, error)
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

SGLangFamily = Literal["llama", "deepseek"]
Support = Literal["captured", "crash", "unknown"]  # what a request for the embedding does


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
        v = version_tuple(version)
        return (self.since is None or v >= version_tuple(self.since)) and (
            self.before is None or v < version_tuple(self.before)
        )

    @property
    def span(self) -> str:
        if self.since and self.before:
            return f"{self.since} <= version < {self.before}"
        if self.since:
            return f">= {self.since}"
        return f"< {self.before}" if self.before else "every version"


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
        "llama", None, "0.5.14", "sglang_llama", "unknown",
        "not read from a release before 0.5.14; 0.5.14 to 0.5.21 crash (" + _LLAMA_CRASH + ")",
        "-1 (the +1 rule makes it layers_to_capture 0)", "unknown", "not read", (),
    ),
    SGLangCaptureFacts(
        "llama", "0.5.14", "0.5.22", "sglang_llama", "crash", _LLAMA_CRASH,
        "-1 (the +1 rule makes it layers_to_capture 0)", "silent", _LLAMA_SHORT, ("0.5.14", "0.5.17", "0.5.20", "0.5.21"),
    ),
    SGLangCaptureFacts(
        "llama", "0.5.22", None, "sglang_llama", "captured", _LLAMA_OK,
        "-1 (the +1 rule makes it layers_to_capture 0)", "silent", _LLAMA_SHORT, ("0.5.22", "0.5.23"),
    ),
    SGLangCaptureFacts(
        # The always-+1 rule of the seed report (BRIEF bug 3); no wheel of it was read.
        "deepseek", None, "0.5.14", "sglang_deepseek_old", "unknown",
        "not read from a release before 0.5.14", "-1 (always +1)", "unknown", "not read", (),
    ),
    SGLangCaptureFacts(
        "deepseek", "0.5.14", "0.5.17", "sglang_deepseek", "captured", _DEEPSEEK_OK,
        "0 when the first id is not 1 (-1 is never reached)", "unknown", "not read (no AuxHiddenStatePacker yet)", ("0.5.14",),
    ),
    SGLangCaptureFacts(
        "deepseek", "0.5.17", None, "sglang_deepseek", "captured", _DEEPSEEK_OK,
        "0 when the first id is not 1 (-1 is never reached)", "raises", _DEEPSEEK_RAISES,
        ("0.5.17", "0.5.20", "0.5.21", "0.5.22", "0.5.23"),
    ),
)
# The release whose rules apply when the version is unknown.
SGLANG_LATEST_READ = "0.5.23"


def sglang_family(architecture: str | Sequence[str]) -> str | None:
    """The target family of a class name (or a class's MRO names, most derived first).

    ``llama`` is SGLang's ``models/llama.py::LlamaForCausalLM`` and its subclasses (which run
    its ``LlamaModel``); ``deepseek`` is DeepSeek V2/V3 and Kimi-K2.5 (which delegates to
    it). Any other name: None (the table says nothing about it).
    """
    names = [architecture] if isinstance(architecture, str) else list(architecture)
    for name in names:
        low = name.lower()
        if "deepseek" in low or "kimi" in low:
            return "deepseek"
        if name == "LlamaForCausalLM":
            return "llama"
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
    Names outside the table's families get the Llama rule, the +1 most SGLang targets apply.
    """
    facts = sglang_capture_facts(architecture, sglang_version)
    return facts.rule if facts is not None else "sglang_llama"


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
