"""The acceptance panel: mean accept length per step and over the run, draft tokens,
requests, and the acceptance rate per draft position, from the per-step rows the loader
folded (:class:`~spectrace.viewers.traceset.AcceptanceLog`)."""

from __future__ import annotations

from spectrace.rules.acceptance import mean_from_sums

from .limits import MAX_POSITIONS
from .parts import AcceptanceView, ViewFilter
from .traceset import TraceFile, merge_rows


def acceptance_files(files: list[TraceFile]) -> list[TraceFile]:
    """The files whose acceptance records count: under tensor parallelism every rank of a
    server records the same verify steps, so of the ranks of one host only the lowest one's
    count (a verify step is one step, not one per rank)."""
    lowest: dict[str, int] = {}
    for f in files:
        host = f.header.host if f.header else ""
        if f.rank is not None and f.acceptance:
            lowest[host] = min(lowest.get(host, f.rank), f.rank)
    return [f for f in files if f.rank is None or lowest.get(f.header.host if f.header else "") in (None, f.rank)]


def build_acceptance(files: list[TraceFile], flt: ViewFilter) -> AcceptanceView:
    """The acceptance panel from the per-step rows the loader folded (see AcceptanceLog)."""
    files = acceptance_files(files)
    per_step: dict[int, list[int]] = {}
    total = [0, 0, 0, 0, 0]
    for f in files:
        log = f.acceptance
        for step, row in log.by_step.items():
            if flt.step_ok(step):
                merge_rows(per_step.setdefault(step, [0, 0, 0, 0, 0]), row)
                merge_rows(total, row)
        # Steps past the per-step cap are in the whole run's totals; a step filter cannot see them.
        if log.beyond is not None and flt.step_min is None and flt.step_max is None:
            merge_rows(total, log.beyond)
    view = AcceptanceView()
    if not total[0]:
        return view
    # A step whose records name no request (accept_lengths: []) has no accept length to show.
    view.steps = sorted(s for s, row in per_step.items() if row[2])
    view.mean_accept = [round(mean_from_sums(per_step[s][1], per_step[s][2]) or 0.0, 4) for s in view.steps]  # each row[2] > 0
    view.batch = [per_step[s][2] for s in view.steps]
    view.requests = total[2]
    overall = mean_from_sums(total[1], total[2])
    view.overall_mean = None if overall is None else round(overall, 4)
    view.draft_tokens = total[3]
    if total[4]:  # some record said how many accepted each position
        shown = min(total[3], MAX_POSITIONS)
        positions = (total[5 : 5 + shown] + [0] * shown)[:shown]
        view.position_rate = [round(n / total[2], 4) if total[2] else 0.0 for n in positions]
    return view
