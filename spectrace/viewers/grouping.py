"""The findings as the view lists them: one group per code and severity (counts, steps,
modules, ranks), each root cause followed by the findings that follow from it.

Which finding follows from which is decided in :mod:`spectrace.checks.root_causes`; this
only orders and groups what the files hold.
"""

from __future__ import annotations

from collections import defaultdict

from spectrace.checks.root_causes import root_causes
from spectrace.records import SEVERITY_RANK
from spectrace.rules.catalogue import CATALOGUE

from .header import once_counts
from .parts import FindingGroup, ViewFilter
from .traceset import TraceFile


def group_findings(files: list[TraceFile], flt: ViewFilter) -> list[FindingGroup]:
    """The findings of the files one group per (code, severity), filtered, each root cause
    followed by its consequences."""
    groups: dict[tuple[str, str], FindingGroup] = {}
    for f in files:
        repeats = once_counts(f)
        for fd in f.findings:
            if not flt.finding_ok(fd):
                continue
            key = (fd.code, fd.severity)
            g = groups.get(key)
            if g is None:
                entry = CATALOGUE.get(fd.code)
                # model_construct: the values come validated from the records; a trace can
                # hold tens of thousands of codes, and validation was most of their cost.
                g = groups[key] = FindingGroup.model_construct(
                    code=fd.code,
                    severity=fd.severity,
                    count=0,
                    message=fd.message,
                    cause=entry.meaning if entry else "",
                    fix=fd.fix or (entry.fix if entry else ""),
                    evidence=fd.evidence,
                )
            g.count += repeats.get(fd.once_key, 1) if fd.once_key else 1
            if fd.step is not None:
                g.first_step = fd.step if g.first_step is None else min(g.first_step, fd.step)
                g.last_step = fd.step if g.last_step is None else max(g.last_step, fd.step)
            if fd.module and fd.module not in g.modules:
                g.modules.append(fd.module)
            if f.rank is not None and f.rank not in g.ranks:
                g.ranks.append(f.rank)
        if flt.module or flt.step_min is not None or flt.step_max is not None:
            continue  # counts only: no module, no step of each; the load problem line says so
        for (code, severity), folded in f.findings_folded.items():
            g = groups.get((code, severity))
            if g is None:
                entry = CATALOGUE.get(code)
                g = groups[(code, severity)] = FindingGroup(
                    code=code,
                    severity=severity,
                    count=0,
                    message="(kept as a count only: see the load problems)",
                    cause=entry.meaning if entry else "",
                    fix=entry.fix if entry else "",
                )
            g.count += folded.count
            for step in (folded.first_step, folded.last_step):
                if step is not None:
                    g.first_step = step if g.first_step is None else min(g.first_step, step)
                    g.last_step = step if g.last_step is None else max(g.last_step, step)
            if f.rank is not None and f.rank not in g.ranks:
                g.ranks.append(f.rank)
    # Judged over every finding the step and module filters pass, before --finding: a
    # consequence shown alone still names its root and the root's fix.
    out = by_root_cause(list(groups.values()))
    return [g for g in out if not flt.finding or g.code == flt.finding]


def by_root_cause(found: list[FindingGroup]) -> list[FindingGroup]:
    """Each root cause followed by its consequences (nearest first); the others in their order.

    One pass over the groups (a trace can hold tens of thousands of codes): each
    consequence is filed under its root once, and chain depths are memoised.
    """
    by_code = {g.code: g for g in found if g.severity == "error"}
    beneath: dict[str, list[FindingGroup]] = defaultdict(list)
    for g, judged in zip(found, root_causes(found)):
        if judged.follows_from is None and judged.root is None and not judged.also:
            continue  # stands alone: the defaults say so already (a pydantic setattr costs)
        g.follows_from, g.root, g.how, g.also_from = judged.follows_from, judged.root, judged.how, list(judged.also)
        if judged.root is not None:
            g.root_fix = by_code[judged.root].fix
            beneath[judged.root].append(g)

    depths: dict[str, int] = {}

    def depth(g: FindingGroup) -> int:
        d, at = 0, g
        while at.follows_from is not None and d < len(found):
            if at.code in depths:
                d += depths[at.code]
                break
            d, at = d + 1, by_code[at.follows_from]
        depths[g.code] = d
        return d

    # Causes before symptoms: an acceptance collapse is explained by the other findings.
    symptom = {"acceptance_collapse": 1}

    def key(g: FindingGroup) -> tuple[int, int, int, str]:
        return (SEVERITY_RANK.get(g.severity, 9), symptom.get(g.code, 0), -g.count, g.code)

    out: list[FindingGroup] = []
    for g in sorted((g for g in found if g.root is None), key=key):
        below = sorted(beneath.get(g.code, []), key=lambda c: (depth(c), key(c))) if g.severity == "error" else []
        if below:
            g.consequences = [c.code for c in below]
        out += [g, *below]
    return out
