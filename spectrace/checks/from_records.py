"""The findings a trace's own records imply: one home for every consumer.

``spectrace view`` (and ``--follow``, ``diff``, the notebook API) runs these over the calls
of each trace file it loads; a :class:`spectrace.Trace` runs them over its calls while open
(``Trace.findings``) and when it closes; the pytest plugin reads ``Trace.findings``. One
function, one set of rules, one severity, so every consumer gives the same verdict.

A finding already recorded (by an integration at load or capture time, or by an earlier
pass of this function) is not made again: a code this pass would make is left out when a
finding of that code (and, for per-module codes, that module) is already there.

    >>> derived = findings_from_records(calls, recorded_findings, coverage)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..records import Call, Capture, Coverage, Finding
from .calls import check_fc_called, check_nonfinite
from .capture import check_capture, check_config_flags
from .weights import check_hot_token_map

# The coverage note that says the draft's fc was not traced: with no fc calls to see, a
# bypass cannot be told from an fc left out of the trace, so the fc check stays silent.
FC_NOT_TRACED = "the draft's fc is not traced"

# Codes whose finding names one module each: another module's is news. For the others
# (fc_bypass) one finding per trace says it all.
_PER_MODULE = frozenset({"nonfinite"})


def fc_traced(coverage: Iterable[Coverage]) -> bool:
    """False when the trace says its draft's fc was left out of the traced modules."""
    return not any(c.kind == "unhooked" and c.detail.startswith(FC_NOT_TRACED) for c in coverage)


def findings_from_records(calls: Sequence[Call], recorded: Iterable[Finding] = (), coverage: Iterable[Coverage] = ()) -> list[Finding]:
    """The findings ``calls`` imply that ``recorded`` does not hold yet, in a stable order."""
    have_codes: set[str] = set()
    have: set[tuple[str, str | None]] = set()
    for f in recorded:
        have_codes.add(f.code)
        have.add((f.code, f.module))
    made: list[Finding] = list(check_nonfinite(calls))
    if fc_traced(coverage):
        made += check_fc_called(calls)
    out: list[Finding] = []
    for f in made:
        if (f.code, f.module) in have if f.code in _PER_MODULE else f.code in have_codes:
            continue
        have_codes.add(f.code)
        have.add((f.code, f.module))
        out.append(f)
    return out


def findings_from_model_facts(
    captures: Sequence[Capture],
    draft_config: Mapping[str, Any] | None,
    *,
    engine: str = "sglang",
    hot_map_loaded: bool | None = None,
    draft_name: str = "draft",
) -> list[Finding]:
    """What the models handed to ``trace()`` say, checked as a server's start-up is: each
    target's capture against the draft's config, the training flags the engine ignores, and
    a reduced vocabulary without its id map. No algorithm is known here (no launch line)."""
    found: list[Finding] = []
    for capture in captures:
        found += check_capture(capture, draft_config)
    if draft_config:
        found += check_config_flags(draft_config, engine)
        if hot_map_loaded is not None:
            found += check_hot_token_map(
                draft_config.get("draft_vocab_size"),
                draft_config.get("vocab_size"),
                hot_map_loaded,
                module=f"{draft_name}.hot_token_id",
                source="checks.from_records",
            )
    return found
