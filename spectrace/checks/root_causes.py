"""Which findings of a trace are root causes, and which follow from them.

One wiring bug is seen several times: with aux capture off the draft gets hidden-size
wide states (``fc_bypass``) and the target rejects its tokens (``acceptance_collapse``).
Three findings, one cause, one fix. :data:`RULES` says which code can follow from
which; :func:`root_causes` applies them to the findings of one trace and names, for
each finding, the one it follows from and the root at the top of that chain.

Only error findings are roots: a warning is a doubt, not a cause. Torch-free; it reads
findings (or anything with ``code``, ``severity``, ``module`` and ``evidence``).

    >>> from spectrace.rules.catalogue import finding
    >>> found = [finding("fc_bypass", "64-wide"), finding("aux_capture_disabled", "off", evidence={"enabled": False}),
    ...          finding("acceptance_collapse", "1.00")]
    >>> [(j.code, j.root) for j in root_causes(found)]
    [('fc_bypass', 'aux_capture_disabled'), ('aux_capture_disabled', None), ('acceptance_collapse', 'aux_capture_disabled')]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol


class Judged(Protocol):
    """What a rule reads of a finding: a :class:`~spectrace.records.Finding` or the view's group of one code."""

    @property
    def code(self) -> str: ...
    @property
    def severity(self) -> str: ...
    @property
    def evidence(self) -> Mapping[str, Any]: ...


# A condition on (consequence, root): True when this root explains this consequence.
When = Callable[[Judged, Judged], bool]


@dataclass(frozen=True)
class FollowsFrom:
    """``consequence`` follows from any of ``roots`` (tried in order, the most direct first)."""

    consequence: str
    roots: tuple[str, ...]
    how: str  # one line: why the consequence follows
    when: When | None = None


def _capture_off_by_algorithm_alone(consequence: Judged, root: Judged) -> bool:
    # With use_aux_hidden_state false as well, switching the algorithm alone leaves capture
    # off: aux_capture_disabled is then a cause of its own, with the fix for both.
    return consequence.evidence.get("use_aux_hidden_state") is not False


def _same_rename(consequence: Judged, root: Judged) -> bool:
    """The missing parameters are the ones the dropped tensors were meant for (one rename fixes both)."""
    renames = root.evidence.get("rename_map")
    if renames:  # the runtime check: both findings carry the rename they share
        return bool(consequence.evidence.get("rename_map") == renames)
    rename = root.evidence.get("rename")  # the audit: one finding per renamed prefix
    to = rename.get("to") if isinstance(rename, Mapping) else None
    params = consequence.evidence.get("parameters") or []
    return isinstance(to, str) and bool(to) and any(isinstance(p, str) and to in p for p in params)


def _a_width_check(consequence: Judged, root: Judged) -> bool:
    # shape_mismatch is also a tensor's shape in the checkpoint, which no capture explains.
    return "seen_width" in consequence.evidence or "seen_chunks" in consequence.evidence


# The causes each stage of a replayed draft diverges for (spectrace.replay.compare.CAUSES),
# as the findings that name them: a diverging stage follows from one of these, present.
REPLAY_STAGE_ROOTS: dict[str, tuple[str, ...]] = {
    "embed": ("weights_replaced_after_load",),
    "fc": ("weights_missing", "weights_dropped", "unsupported_config_flag"),
    "decoder layer": ("rope_mismatch", "unsupported_config_flag", "weights_missing", "weights_dropped"),
    "final norm": ("unsupported_config_flag", "weights_missing", "weights_dropped"),
    "lm_head": ("weights_replaced_after_load", "weights_missing", "weights_dropped"),
    "vocabulary map": ("vocab_map_invalid",),
}


def _explains_the_stage(consequence: Judged, root: Judged) -> bool:
    """The replayed stage that diverged is one this root makes diverge."""
    stages = [getattr(consequence, "module", None), *(getattr(consequence, "modules", None) or [])]
    return any(root.code in REPLAY_STAGE_ROOTS.get(str(stage), ()) for stage in stages if stage)


# What makes the draft run on inputs or weights it was not trained with, or as another
# model: each of these, as an error, explains a collapsed acceptance. The most direct
# symptom first, so a collapse reads as following from the fc bypass, and the bypass from
# the capture; a replay that saw the draft compute otherwise than its checkpoint is the
# most direct of all.
DRAFT_INPUT_OR_WEIGHTS: tuple[str, ...] = (
    "replay_divergence",
    # The probe measured the served draft agreeing with its target less than under another
    # setting: the draft runs as it was not trained.
    "probe_better_variant",
    "fc_bypass",
    "shape_mismatch",
    "feature_skew",
    "values_boundary_mismatch",
    "values_chunk_unmatched",
    "chunk_provenance",
    "chunk_unmatched",
    "nonfinite",
    "short_capture",
    "aux_layers_mismatch",
    "logits_fallback",
    "aux_capture_disabled",
    "algorithm_mismatch",
    "capture_unsupported",
    "draft_class_mismatch",
    "weights_replaced_after_load",
    "weights_missing",
    "weights_dropped",
    "unsupported_config_flag",
    "rope_mismatch",
    "vocab_map_invalid",
)

RULES: tuple[FollowsFrom, ...] = (
    FollowsFrom(
        "aux_capture_disabled",
        ("algorithm_mismatch",),
        "the target captures aux states under the EAGLE3 algorithm only",
        _capture_off_by_algorithm_alone,
    ),
    FollowsFrom(
        "logits_fallback",
        ("aux_capture_disabled", "algorithm_mismatch"),
        "with no aux states captured, the logits processor stores the final hidden state",
    ),
    FollowsFrom(
        "fc_bypass",
        ("short_capture", "logits_fallback", "aux_capture_disabled", "algorithm_mismatch"),
        "fewer aux states than fc takes: an input as wide as the hidden size skips fc",
    ),
    FollowsFrom(
        "shape_mismatch",
        ("short_capture",),
        "fewer aux states than fc takes: the fused input is narrower than fc.in_features",
        _a_width_check,
    ),
    FollowsFrom(
        "short_capture",
        ("aux_layers_mismatch",),
        "the ids that capture other layers than trained also name layers the target does not have",
    ),
    FollowsFrom(
        "feature_skew",
        ("aux_layers_mismatch", "short_capture", "chunk_provenance"),
        "chunks from other layers than trained have other statistics",
    ),
    FollowsFrom(
        "chunk_provenance",
        ("aux_layers_mismatch",),
        "the chunks come from the boundaries the ids capture, not the trained ones",
    ),
    FollowsFrom(
        "weights_missing",
        ("weights_dropped",),
        "the tensors meant for these parameters were dropped under other names",
        _same_rename,
    ),
    FollowsFrom(
        "replay_divergence",
        tuple(dict.fromkeys(code for roots in REPLAY_STAGE_ROOTS.values() for code in roots)),
        "the replayed stage diverges where this cause changes what the draft computes",
        _explains_the_stage,
    ),
    FollowsFrom(
        "acceptance_collapse",
        DRAFT_INPUT_OR_WEIGHTS,
        "a draft fed other inputs or weights than it was trained with, or built as another model, proposes tokens the target rejects",
    ),
)
RULE_BY_CODE: dict[str, FollowsFrom] = {r.consequence: r for r in RULES}


@dataclass(frozen=True)
class Judgement:
    """Where one finding stands: ``follows_from`` and ``root`` are None for a root or a finding that stands alone."""

    code: str
    follows_from: str | None = None  # the finding it follows from directly
    root: str | None = None  # the top of that chain: the one whose fix clears this one
    how: str = ""  # why it follows (the rule's line)
    also: tuple[str, ...] = ()  # other root causes present that explain it as well


def _parents(i: int, findings: Sequence[Judged]) -> list[int]:
    """Every finding ``findings[i]`` can follow from, the rule's preferred first."""
    me = findings[i]
    rule = RULE_BY_CODE.get(me.code)
    if rule is None:
        return []
    out = []
    for root_code in rule.roots:
        for j, other in enumerate(findings):
            if j == i or other.code != root_code or other.severity != "error":
                continue
            if rule.when is None or rule.when(me, other):
                out.append(j)
    return out


def root_causes(findings: Sequence[Judged]) -> list[Judgement]:
    """One :class:`Judgement` per finding, in the same order."""
    candidates = [_parents(i, findings) for i in range(len(findings))]
    parents = [c[0] if c else None for c in candidates]

    def top(i: int) -> int | None:
        """The root above ``i`` (None: ``i`` has no parent, or sits in a cycle)."""
        at, seen = parents[i], {i}
        while at is not None and parents[at] is not None:
            if at in seen:  # the rules form no cycle; stop at one anyway
                return None
            seen.add(at)
            at = parents[at]
        return None if at in seen else at

    out = []
    for i, f in enumerate(findings):
        root, parent = top(i), parents[i]
        if root is None or parent is None:
            out.append(Judgement(f.code))
            continue
        # Another cause present explains it as well (a collapse with two bugs): said, not hidden.
        others = {findings[r].code for r in (j if parents[j] is None else top(j) for j in candidates[i][1:]) if r is not None}
        also = tuple(sorted(others - {findings[root].code}))
        out.append(Judgement(f.code, findings[parent].code, findings[root].code, RULE_BY_CODE[f.code].how, also))
    return out
