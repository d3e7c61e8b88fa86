"""Where each chunk of the fused draft input came from, told by its statistics.

A traced target step carries the statistics of the residual stream at each boundary
(``target.embed`` is boundary 0, ``target.layer[k]``'s ``output.residual_stream`` is
boundary k+1; Hugging Face ``hidden_states`` numbering) and, in the same step, the
statistics of each chunk of the fused draft input (``target.aux_concat``,
``output.chunk[i]``). A chunk that *is* boundary b holds the same values over the same
rows, so the same mean, std, absmax and numel up to the rounding of the reductions. So
its boundary can be read off, without any reference, and compared with what the
``capture`` record says the target captures:

    >>> match_chunks({1: s1, 2: s2, 4: s4}, [s1, s2, s4])
    [1, 2, 4]
    >>> check_chunk_provenance([(boundaries, chunks)], expected=[1, 2, 4], module="model.aux_concat")
    []

Only rows that both sides cover can be compared: a chunk whose numel differs from a
boundary's (EXTEND steps store the pruned rows of the aux states) is not compared with it.
Pure functions on records: no torch.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..records import Finding, TensorStats
from ..rules.catalogue import finding
from ..rules.roles import TARGET_AUX_CONCAT, is_target_role
from ..rules.roles import boundary_of_role as _boundary_of_role

# Two statistics of the same values may differ by the rounding of a bf16 tensor (8
# significant bits: 2**-8 relative per element, so absmax up to that, mean and std far
# less) and by the order of float32 reductions. Four times that is still well below the
# step between two boundaries of a residual stream, and of two boundaries within it the
# closer one wins.
TOLERANCE = 2.0**-6

LAYER_ARG = "output.residual_stream"
EMBED_ARG = "output"
_CHUNK_ARG = re.compile(r"^output\.chunk\[(\d+)\]$")

# (mean, std, absmax or None, numel): what a comparison needs, cheap to keep per step.
Key = tuple[float, float, float | None, int]


# --------------------------------------------------------------------------- names
_boundary_cache: dict[str, int | None] = {}
_chunk_cache: dict[str, int | None] = {}


def boundary_of_role(role: str | None) -> int | None:
    """The boundary a target record's role measures: 0 for ``target.embed``, k+1 for ``target.layer[k]``."""
    if not role:
        return None
    try:
        return _boundary_cache[role]
    except KeyError:
        pass
    b = _boundary_of_role(role)
    if len(_boundary_cache) < 4096:
        _boundary_cache[role] = b
    return b


def chunk_of_arg(arg: str | None) -> int | None:
    """The chunk index of an ``output.chunk[i]`` argument, else None."""
    if not arg:
        return None
    try:
        return _chunk_cache[arg]
    except KeyError:
        pass
    m = _CHUNK_ARG.match(arg)
    i = int(m.group(1)) if m else None
    if len(_chunk_cache) < 4096:
        _chunk_cache[arg] = i
    return i


def describe_boundary(b: int | None) -> str:
    """``boundary 3 (layer 2 output)``, ``boundary 0 (embedding output)``, ``no boundary``."""
    if b is None:
        return "no boundary"
    return f"boundary {b} (embedding output)" if b == 0 else f"boundary {b} (layer {b - 1} output)"


def describe_provenance(boundaries: Sequence[int | None]) -> list[str]:
    """One line per chunk, for a viewer: ``chunk 1 = boundary 3 (layer 2 output)``."""
    return [f"chunk {i} = {describe_boundary(b)}" for i, b in enumerate(boundaries)]


# --------------------------------------------------------------------------- matching
def stats_key(stats: TensorStats | Mapping[str, Any] | Key | None) -> Key | None:
    """The comparable part of one tensor's statistics, or None when it has none (NaN, Inf, empty)."""
    if stats is None:
        return None
    if isinstance(stats, tuple):
        return stats
    if isinstance(stats, TensorStats):
        mean, std, absmax, numel, nan, inf = stats.mean, stats.std, stats.absmax, stats.numel, stats.nan, stats.inf
    else:  # a dict (the hot path's JSON-ready fields)
        get = stats.get
        mean, std, absmax, numel, nan, inf = get("mean"), get("std"), get("absmax"), get("numel"), get("nan"), get("inf")
    if mean is None or std is None or not numel or nan or inf:
        return None
    return (float(mean), float(std), None if absmax is None else float(absmax), int(numel))


def distance(chunk: Key, boundary: Key) -> float | None:
    """How far two statistics are apart, relative to their scale; None when they cover different numbers of values."""
    c_mean, c_std, c_abs, c_n = chunk
    b_mean, b_std, b_abs, b_n = boundary
    if c_n != b_n:
        return None
    scale = max(c_std, b_std)
    if not scale > 0:
        scale = max(abs(c_mean), abs(b_mean))
    d = 0.0 if not scale > 0 else max(abs(c_mean - b_mean), abs(c_std - b_std)) / scale
    if c_abs is not None and b_abs is not None:
        top = max(abs(c_abs), abs(b_abs))
        if top > 0:
            d = max(d, abs(c_abs - b_abs) / top)
    return d if math.isfinite(d) else None


@dataclass
class Match:
    """One chunk against one step's boundaries."""

    boundary: int | None  # the closest boundary within the tolerance
    compared: list[int]  # boundaries with the same numel
    nearest: int | None = None  # the closest compared boundary, within the tolerance or not
    nearest_distance: float | None = None


def match_one(chunk: Key | None, boundaries: Mapping[int, Key | None], tolerance: float = TOLERANCE) -> Match:
    """The boundary one chunk equals (closest within ``tolerance``) and what it was compared with."""
    compared: list[int] = []
    best: int | None = None
    best_d = math.inf
    if chunk is not None:
        c_n = chunk[3]
        for b in sorted(boundaries):
            key = boundaries[b]
            if key is None or key[3] != c_n:
                continue
            d = distance(chunk, key)
            if d is None:
                continue
            compared.append(b)
            if d < best_d:
                best, best_d = b, d
    if best is None:
        return Match(None, compared)
    return Match(best if best_d <= tolerance else None, compared, best, best_d)


def match_chunks(
    boundary_stats: Mapping[int, TensorStats], chunk_stats: Sequence[TensorStats | None], tolerance: float = TOLERANCE
) -> list[int | None]:
    """For each chunk, the boundary whose statistics it equals (the closest within ``tolerance``), or None."""
    keys = {b: stats_key(s) for b, s in boundary_stats.items()}
    return [match_one(stats_key(c), keys, tolerance).boundary for c in chunk_stats]


# --------------------------------------------------------------------------- over steps
@dataclass
class _Unmatched:
    step: int | None
    stats: Key
    compared: list[int]
    nearest: int | None
    nearest_distance: float | None


@dataclass
class ProvenanceTally:
    """Votes per chunk over steps: which boundary each chunk matched, or that it matched none.

    A step votes for a chunk only when the chunk could be compared: some boundary covers
    the same rows and, when ``expected`` is known, the expected boundary is among them (a
    step whose records lack it cannot tell a wrong chunk from a missing record).
    """

    tolerance: float = TOLERANCE
    votes: list[Counter[int | None]] = field(default_factory=list)
    unmatched: dict[int, _Unmatched] = field(default_factory=dict)
    steps: int = 0

    def add(
        self,
        boundary_stats: Mapping[int, TensorStats | Key | None],
        chunk_stats: Sequence[TensorStats | Key | None],
        expected: Sequence[int] | None = None,
        step: int | None = None,
    ) -> None:
        keys = {b: stats_key(s) for b, s in boundary_stats.items()}
        while len(self.votes) < len(chunk_stats):
            self.votes.append(Counter())
        voted = False
        for i, raw in enumerate(chunk_stats):
            chunk = stats_key(raw)
            if chunk is None:
                continue
            m = match_one(chunk, keys, self.tolerance)
            if not m.compared:
                continue  # other rows than every boundary (EXTEND): nothing to say
            if expected is not None and i < len(expected) and expected[i] not in m.compared:
                continue  # the expected boundary's record is missing: a near neighbour would read as a wrong one
            self.votes[i][m.boundary] += 1
            voted = True
            if m.boundary is None and i not in self.unmatched:
                self.unmatched[i] = _Unmatched(step, chunk, m.compared, m.nearest, m.nearest_distance)
        self.steps += voted

    def provenance(self) -> list[int | None]:
        """The majority boundary of each chunk (None: matched none, or never compared)."""
        return [votes.most_common(1)[0][0] if votes else None for votes in self.votes]

    def findings(self, expected: Sequence[int] | None, module: str) -> list[Finding]:
        return [make() for _key, make in self.problems(expected, module)]

    def problems(self, expected: Sequence[int] | None, module: str) -> list[tuple[str, Any]]:
        """``(once key, make)`` for each finding, built only when ``make()`` is called."""
        seen = self.provenance()
        out: list[tuple[str, Any]] = []
        for i, votes in enumerate(self.votes):
            if votes and seen[i] is None and i in self.unmatched:
                out.append((f"chunk_unmatched:{module}:{i}", _unmatched_maker(self, i, seen, expected, module)))
        if expected is not None:
            wrong = {i: b for i, b in enumerate(seen) if b is not None and i < len(expected) and b != expected[i]}
            if wrong:
                out.append((f"chunk_provenance:{module}:{seen}", _provenance_maker(self, wrong, seen, expected, module)))
        return out


def _fmt(key: Key) -> str:
    mean, std, absmax, numel = key
    tail = f", absmax {absmax:.4g}" if absmax is not None else ""
    return f"mean {mean:.4g}, std {std:.4g}{tail}, numel {numel}"


def _span(boundaries: Sequence[int]) -> str:
    return ", ".join(str(b) for b in boundaries) if boundaries else "none"


def _steps(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"


def _span_or_unknown(boundaries: Sequence[int | None]) -> str:
    return ", ".join("?" if b is None else str(b) for b in boundaries)


def _unmatched_maker(tally: ProvenanceTally, i: int, seen: list[int | None], expected: Sequence[int] | None, module: str) -> Any:
    u = tally.unmatched[i]
    votes = tally.votes[i]
    total = sum(votes.values())
    misses = votes[None]

    def make() -> Finding:
        near = ""
        if u.nearest is not None and u.nearest_distance is not None:
            near = f"; nearest {describe_boundary(u.nearest)}, {u.nearest_distance:.1%} off"
        hint = "" if 0 in u.compared else " (the embedding output was not traced: it may be that)"
        want = f", the capture says {describe_boundary(expected[i])}" if expected is not None and i < len(expected) else ""
        return finding(
            "chunk_unmatched",
            f"chunk {i} of the fused draft input equals none of the target's traced residual-stream boundaries in {misses} "
            f"of {_steps(total)} compared ({_fmt(u.stats)}; compared with boundaries {_span(u.compared)}{near}){want}{hint}",
            module=module,
            evidence={
                "chunks": {str(i): f"{_fmt(u.stats)}; compared with boundaries {_span(u.compared)}{near}"},
                "seen_boundaries": seen,
                "captured_boundaries": list(expected) if expected is not None else None,
                "numel": u.stats[3],
                "first_step": u.step,
            },
            fix=f"find what writes chunk {i} of the aux hidden states: the draft expects the raw residual stream "
            f"(hidden_states + residual){' at ' + describe_boundary(expected[i]) if expected is not None and i < len(expected) else ''}"
            ", over the step's own rows; check a stale buffer under CUDA-graph replay and any norm or scale before the concat",
            step=u.step,
            source="checks.provenance",
        )

    return make


def _provenance_maker(tally: ProvenanceTally, wrong: dict[int, int], seen: list[int | None], expected: Sequence[int], module: str) -> Any:
    def make() -> Finding:
        lines = {str(i): f"{describe_boundary(b)}, not {describe_boundary(expected[i])}" for i, b in wrong.items()}
        detail = "; ".join(f"chunk {i} is {why}" for i, why in lines.items())
        shifts = {b - expected[i] for i, b in wrong.items()}
        full = list(seen[: len(expected)])
        if len(shifts) == 1 and len(wrong) == len(expected):
            d = shifts.pop()
            how = (
                f"every chunk is {abs(d)} boundary{'s' if abs(d) != 1 else ''} {'deeper' if d > 0 else 'shallower'} than the "
                f"capture rule says: the engine reads the layer ids with another shift than the rule spectrace applied"
            )
        elif sorted(b for b in full if b is not None) == sorted(expected):
            how = "the right boundaries in another order: the chunks are concatenated in another order than the capture list"
        else:
            how = "the engine captures other layers than its capture rule says"
        fix = (
            f"the target really feeds the draft boundaries [{_span_or_unknown(full)}] where the capture record says "
            f"{list(expected)} ({how}). "
            "Find what changed the capture (a patched or other SGLang release, layers_to_capture set after load, the "
            "aux states reordered), then write eagle_aux_hidden_state_layer_ids so the captured boundaries equal the ones "
            "the draft was trained on, and check again"
        )
        return finding(
            "chunk_provenance",
            f"{len(wrong)} of {len(seen)} chunks of the fused draft input come from other boundaries than the capture "
            f"record says ({detail}; the majority over {_steps(tally.steps)})",
            module=module,
            evidence={"chunks": lines, "seen_boundaries": seen, "captured_boundaries": list(expected)},
            fix=fix,
            source="checks.provenance",
        )

    return make


Step = tuple[Mapping[int, TensorStats], Sequence[TensorStats | None]]


def check_chunk_provenance(
    steps: Iterable[Step], expected: Sequence[int] | None, module: str, tolerance: float = TOLERANCE
) -> list[Finding]:
    """``chunk_unmatched`` for each chunk that matches no boundary, ``chunk_provenance`` when chunks come from
    other boundaries than ``expected`` (the capture record's ``boundaries``); majority vote per chunk over ``steps``."""
    tally = ProvenanceTally(tolerance)
    for boundary_stats, chunk_stats in steps:
        tally.add(boundary_stats, chunk_stats, expected)
    return tally.findings(expected, module)


def provenance(steps: Iterable[Step], tolerance: float = TOLERANCE) -> list[int | None]:
    """The boundary each chunk came from (majority over ``steps``; None where it matched none)."""
    tally = ProvenanceTally(tolerance)
    for boundary_stats, chunk_stats in steps:
        tally.add(boundary_stats, chunk_stats)
    return tally.provenance()


# --------------------------------------------------------------------------- from records
def _get(obj: Any, name: str) -> Any:
    return obj.get(name) if type(obj) is dict or isinstance(obj, Mapping) else getattr(obj, name, None)


def read_call(call: Any) -> tuple[str, int | None, Any] | None:
    """What a target call record says for provenance: ``("boundary", b, stats)`` or
    ``("chunks", width, {index: stats})``; None for any other record. ``call`` is a
    :class:`~spectrace.records.Call` or its JSON-ready dict."""
    role = _get(call, "role")
    if not is_target_role(role):
        return None
    outputs = _get(call, "outputs") or ()
    if role == TARGET_AUX_CONCAT:
        chunks: dict[int, Any] = {}
        width = None
        for meta in outputs:
            i = chunk_of_arg(_get(meta, "arg"))
            if i is None:
                continue
            chunks[i] = _get(meta, "stats")
            if width is None:
                shape = _get(meta, "shape")
                width = int(shape[-1]) if shape else None
        return ("chunks", width, chunks) if chunks else None
    b = boundary_of_role(role)
    if b is None:
        return None
    want = EMBED_ARG if b == 0 else LAYER_ARG
    for meta in outputs:
        if _get(meta, "arg") == want:
            return ("boundary", b, _get(meta, "stats"))
    return None


def _as_stats(raw: Any) -> TensorStats | None:
    if raw is None or isinstance(raw, TensorStats):
        return raw
    return TensorStats.model_validate(raw)


def steps_from_calls(calls: Iterable[Any]) -> dict[int, Step]:
    """Per step of a trace: the boundary statistics and the chunk statistics, for steps that have chunks."""
    bounds: dict[int, dict[int, TensorStats]] = {}
    chunks: dict[int, list[TensorStats | None]] = {}
    for call in calls:
        read = read_call(call)
        if read is None:
            continue
        step = int(_get(call, "step") or 0)
        kind, index, payload = read
        if kind == "boundary":
            stats = _as_stats(payload)
            if stats is not None and index is not None:
                bounds.setdefault(step, {})[index] = stats
        else:
            row: list[TensorStats | None] = [None] * (max(payload) + 1)
            for i, raw in payload.items():
                row[i] = _as_stats(raw)
            chunks[step] = row
    return {step: (bounds.get(step, {}), row) for step, row in sorted(chunks.items())}
