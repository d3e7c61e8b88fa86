"""Provenance by value: which target boundary each chunk of the served fused input really is.

``spectrace compare-train`` recomputes the target's hidden states (Hugging Face
``hidden_states[b]``: 0 the embedding output, b the output of block b-1) for the token ids
kept beside a trace, and measures the cosine of each served chunk against every boundary.
This module reads those numbers: a chunk *matches* the boundaries whose cosine is at least
:data:`MATCH_COSINE` and within :data:`MARGIN` of its best; the draft expects the boundary
it was trained on. No shape check or config reading can tell an embedding chunk from a
block's output of the same width; the values can.

    >>> matches = match_chunks([[0.31, 0.999, 0.9], [0.2, 0.5, 0.9999]])
    >>> [m.best for m in matches]
    [1, 2]
    >>> [f.code for f in check_values(matches, trained=[0, 2], num_layers=2)]
    ['values_boundary_mismatch']
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..records import Finding
from ..rules.catalogue import finding
from ..rules.conventions import CONVENTIONS, engine_boundaries
from ..rules.roles import DRAFT_FC

MATCH_COSINE = 0.99  # bf16 serving against a float32 recompute stays above 0.995 on the same weights
MARGIN = 0.002  # boundaries this close to the best are indistinguishable by value (a layer that barely moves the stream)


def boundary_label(b: int, num_layers: int | None = None) -> str:
    """``the embedding``, ``out(block 2)``; the last boundary is Hugging Face's normed output."""
    if b == 0:
        return "the embedding"
    if num_layers is not None and b == num_layers:
        return f"norm(out(block {b - 1}))"  # transformers' last hidden_states entry has the final norm applied
    return f"out(block {b - 1})"


@dataclass(frozen=True)
class ChunkMatch:
    """One served chunk against every boundary of the target."""

    chunk: int
    cosines: tuple[float, ...]  # per boundary 0..n

    @property
    def best(self) -> int:
        return max(range(len(self.cosines)), key=lambda b: self.cosines[b])

    @property
    def matched(self) -> list[int]:
        """The boundaries this chunk is, by value (empty: none is close enough)."""
        top = self.cosines[self.best]
        if top < MATCH_COSINE:
            return []
        return [b for b, c in enumerate(self.cosines) if c >= MATCH_COSINE and c >= top - MARGIN]

    def ranked(self, count: int = 3) -> list[int]:
        """The ``count`` most similar boundaries, best first."""
        return sorted(range(len(self.cosines)), key=lambda b: -self.cosines[b])[:count]


def match_chunks(cosines: Sequence[Sequence[float]]) -> list[ChunkMatch]:
    """Per chunk (row) the cosine against each boundary (column)."""
    return [ChunkMatch(i, tuple(float(c) for c in row)) for i, row in enumerate(cosines)]


def _ids_for(boundaries: Sequence[int], rule: str | None, num_layers: int) -> list[int] | None:
    """The layer ids that make the engine rule ``rule`` capture ``boundaries`` (None: unknown rule or none do)."""
    if rule not in CONVENTIONS:
        return None
    for shift in (1, 0):
        ids = [b - shift for b in boundaries]
        try:
            if engine_boundaries(ids, rule, num_layers).boundaries == sorted(set(boundaries)):
                return ids
        except ValueError:
            return None
    return None


def _cosines_text(m: ChunkMatch, num_layers: int, also: int | None = None) -> str:
    shown = m.ranked(2)
    if also is not None and also not in shown and also < len(m.cosines):
        shown.append(also)
    return ", ".join(f"{boundary_label(b, num_layers)} {m.cosines[b]:.3f}" for b in shown)


def check_values(
    matches: Sequence[ChunkMatch],
    trained: Sequence[int] | None,
    *,
    num_layers: int,
    captured: Sequence[int] | None = None,
    rule: str | None = None,
    values_file: str = "",
    module: str = DRAFT_FC,
    trained_source: str = "",
    config_ids: Sequence[int] | None = None,
) -> list[Finding]:
    """Findings for chunks that are not the boundary the draft was trained on, or no boundary at all."""
    out: list[Finding] = []
    matched = [m.matched for m in matches]
    unmatched = [m for m in matches if not m.matched]
    evidence_base = {
        "values_file": values_file,
        "matched_boundaries": matched,
        "captured_boundaries": list(captured) if captured is not None else None,
        "cosines": {str(m.chunk): {boundary_label(b, num_layers): round(m.cosines[b], 4) for b in m.ranked(3)} for m in matches},
    }
    if unmatched:
        detail = "; ".join(f"chunk {m.chunk}: best {_cosines_text(m, num_layers)}" for m in unmatched)
        out.append(
            finding(
                "values_chunk_unmatched",
                f"{len(unmatched)} of {len(matches)} chunks of the served fused input equal no hidden state of the target "
                f"recomputed for the same token ids (cosine below {MATCH_COSINE}: {detail})",
                module=module,
                evidence=evidence_base,
                source="checks.values",
            )
        )
    if trained is None or len(trained) != len(matches):
        return out
    wrong = [m for m in matches if m.matched and trained[m.chunk] not in m.matched]
    if not wrong:
        return out
    detail = "; ".join(
        f"chunk {m.chunk} matches {boundary_label(m.best, num_layers)} at {m.cosines[m.best]:.3f}, "
        f"{boundary_label(trained[m.chunk], num_layers)} at {m.cosines[trained[m.chunk]]:.3f}: the draft was trained on "
        f"{boundary_label(trained[m.chunk], num_layers)}"
        for m in wrong
    )
    served = [m.best for m in matches]
    ids = _ids_for(list(trained), rule, num_layers)
    how = f" ({trained_source})" if trained_source else ""
    if ids is not None and config_ids is not None and list(config_ids) == ids:
        change = (
            f"The draft config already asks for {ids}, which the {rule} rule captures as {list(trained)}: the target was "
            "given other ids than that config (another config file, a launch flag, a patched release); serve with this config, "
        )
    elif ids is not None:
        change = f"Set eagle_config.eagle_aux_hidden_state_layer_ids to {ids} (the {rule} rule then captures {list(trained)}), "
    else:
        change = (
            f"Write eagle_config.eagle_aux_hidden_state_layer_ids in the convention the engine applies so it captures {list(trained)}, "
        )
    fix = f"the target serves boundaries {served} by value where the draft was trained on {list(trained)}{how}. {change}then run compare-train again on a new trace"
    out.append(
        finding(
            "values_boundary_mismatch",
            f"{len(wrong)} of {len(matches)} chunks of the served fused input are other hidden states than the draft was "
            f"trained on ({detail})",
            module=module,
            evidence={**evidence_base, "trained_boundaries": list(trained), "served_boundaries": served},
            fix=fix,
            source="checks.values",
        )
    )
    return out
