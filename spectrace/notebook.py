"""Traces from Python: ``spectrace.load(path)`` for notebooks and scripts.

It reads trace files with the viewer's loader and derives the viewer's model
(:class:`~spectrace.viewers.model.TraceView`): the same findings, data path and acceptance
that ``spectrace view`` shows, as objects. The result prints as a compact summary in a
terminal (findings first, then the data path and acceptance) and as HTML tables in
Jupyter; ``rows()`` and ``to_pandas()`` give one row per call and tensor.

    >>> t = spectrace.load("spectrace-demo/fc_bypass")
    >>> t                                    # the summary: findings, data path, acceptance
    >>> [f.code for f in t.findings]
    ['fc_bypass', 'aux_capture_disabled', 'acceptance_collapse']
    >>> df = t.to_pandas()                   # pandas installed: one row per call and tensor
    >>> df[df.role == "draft.fc"][["step", "arg", "shape"]]

No torch is imported: a trace from a GPU server reads on a laptop.
"""

from __future__ import annotations

import html
import os
import shutil
import warnings
from typing import Any

from .present.findings import TABLE_HEAD, summary_lines, table_rows
from .present.findings import cut as _cut
from .records import Call
from .viewers.diff import DEFAULT_RTOL, DiffResult, diff_traces
from .viewers.loader import TraceSet, load_traces, shown_path
from .viewers.model import (
    AcceptanceView,
    DataPath,
    FindingGroup,
    ModuleRow,
    StageView,
    TraceView,
    build_view,
    name_matches,
)
from .viewers.progress import load_progress
from .viewers.render import dtype, num, shape_pattern, steps_text
from .viewers.terminal import printable

# The columns of :meth:`LoadedTrace.rows`, in order (``to_pandas`` keeps it).
ROW_COLUMNS = (
    "file",
    "rank",
    "step",
    "call",
    "module",
    "module_type",
    "role",
    "direction",
    "arg",
    "shape",
    "dtype",
    "device",
    "mean",
    "std",
    "absmax",
    "nan",
    "inf",
    "numel",
    "forward_mode",
    "tokens",
    "draft_step",
    "graph_capture",
    "graph_replay",
)
_STAGES = (("aux", "aux concat"), ("fc", "fc"), ("layer", "layer"), ("norm", "norm"), ("lm_head", "lm_head"), ("d2t", "d2t"))
_SUMMARY_WIDTH = (80, 120)  # the terminal's width, kept within these


class LoadedTrace:
    """One run's traces, loaded: ``traces`` (the loader's records, per file) and ``view``
    (what ``spectrace view`` shows). The shortcuts below read ``view``."""

    def __init__(self, traces: TraceSet, view: TraceView) -> None:
        self.traces = traces
        self.view = view

    # -------------------------------------------------------------------- the view
    @property
    def source(self) -> str:
        return shown_path(self.traces.source)

    @property
    def findings(self) -> list[FindingGroup]:
        """Findings grouped by code, errors first (as in ``spectrace view``)."""
        return self.view.findings

    @property
    def datapath(self) -> DataPath:
        return self.view.datapath

    @property
    def acceptance(self) -> AcceptanceView:
        return self.view.acceptance

    @property
    def modules(self) -> list[ModuleRow]:
        return self.view.modules

    @property
    def problems(self) -> list[str]:
        """What the loader could not read, one line each (also in the summary)."""
        return [p.message for p in self.traces.problems]

    def calls(self, module: str | None = None) -> list[Call]:
        """Call records in file order; ``module`` is a glob on the name or a dotted suffix."""
        return [c for c in self.traces.all("calls") if module is None or name_matches(c.module, module)]

    def diff(self, other: LoadedTrace, *, rtol: float = DEFAULT_RTOL) -> DiffResult:
        """What ``spectrace diff`` reports between this run (A) and ``other`` (B)."""
        return diff_traces(self.traces, other.traces, rtol=rtol)

    # -------------------------------------------------------------------- tables
    def rows(self, module: str | None = None) -> list[dict[str, Any]]:
        """One plain dict per call and tensor (inputs, then outputs), keys :data:`ROW_COLUMNS`.

        ``call`` is the call's order within its process; ``direction`` is ``input`` or
        ``output`` and ``arg`` where the tensor sat (``input[0]``, ``output.chunk[1]``, ...).
        Statistics are None where the trace has none (shapes-only records, or a tensor
        whose statistics are withheld by default)."""
        out: list[dict[str, Any]] = []
        for f in self.traces.files:
            name = f.name
            for c in f.calls:
                if module is not None and not name_matches(c.module, module):
                    continue
                for direction, metas in (("input", c.inputs), ("output", c.outputs)):
                    for m in metas:
                        st = m.stats
                        out.append(
                            {
                                "file": name,
                                "rank": f.rank,
                                "step": c.step,
                                "call": c.seq,
                                "module": c.module,
                                "module_type": c.module_type,
                                "role": c.role,
                                "direction": direction,
                                "arg": m.arg,
                                "shape": tuple(m.shape),
                                "dtype": m.dtype,
                                "device": m.device,
                                "mean": st.mean if st else None,
                                "std": st.std if st else None,
                                "absmax": st.absmax if st else None,
                                "nan": st.nan if st else None,
                                "inf": st.inf if st else None,
                                "numel": st.numel if st else None,
                                "forward_mode": c.forward_mode,
                                "tokens": c.tokens,
                                "draft_step": c.draft_step,
                                "graph_capture": c.graph_capture,
                                "graph_replay": c.graph_replay,
                            }
                        )
        return out

    def to_pandas(self, module: str | None = None) -> Any:
        """:meth:`rows` as a pandas DataFrame (pandas is not a dependency of spectrace)."""
        try:
            import pandas as pd
        except ImportError:
            raise ImportError("to_pandas() needs pandas: pip install pandas (or use .rows(), plain dicts)") from None
        return pd.DataFrame(self.rows(module), columns=list(ROW_COLUMNS))

    # -------------------------------------------------------------------- display
    def summary(self, width: int | None = None) -> str:
        """The compact summary as plain text: findings, data path, acceptance, modules."""
        if width is None:
            cols = shutil.get_terminal_size((100, 24)).columns
            width = min(max(cols, _SUMMARY_WIDTH[0]), _SUMMARY_WIDTH[1])
        # A trace's strings are untrusted: their control characters are shown, not obeyed.
        # One line each; the whole text is in .findings, .view and `spectrace view`.
        return "\n".join(_cut(printable(line), width) for line in _summary_lines(self))

    def __str__(self) -> str:
        return self.summary()

    def __repr__(self) -> str:
        return self.summary()

    def _repr_html_(self) -> str:
        return _html(self)


def load(path: str | os.PathLike[str]) -> LoadedTrace:
    """Read a trace file, or a folder of them (one per process), as ``spectrace view`` does.

    Raises FileNotFoundError or ValueError (one line) when nothing readable is there. Lines
    that cannot be read are skipped, counted, warned about once and kept in ``problems``.
    A large trace shows a progress bar on stderr while it loads, when stderr is a terminal."""
    with load_progress(f"spectrace.load {shown_path(str(path))}") as progress:
        ts = load_traces(path, progress=progress)
    if not ts.readable:
        problems = ts.problems
        message = problems[0].message if problems else f"{shown_path(str(path))}: no readable records"
        if len(problems) > 1:
            message += f" (and {len(problems) - 1} more problems)"
        if problems and problems[0].kind == "missing":
            raise FileNotFoundError(message)
        raise ValueError(message)
    if ts.problems:
        more = f" (and {len(ts.problems) - 1} more problems; see .problems)" if len(ts.problems) > 1 else ""
        warnings.warn(f"spectrace.load: {ts.problems[0].message}{more}", stacklevel=2)
    return LoadedTrace(ts, build_view(ts))


# ----------------------------------------------------------------------------- summary
def _headline(t: LoadedTrace) -> str:
    h = t.view.header
    n = len(h.processes)
    parts = [f"{n} process{'es' if n != 1 else ''}", steps_text(h.step_first, h.step_last), f"{h.steps_traced} traced"]
    parts.append(f"{sum(p.records for p in h.processes)} records")
    parts.append(f"{h.records_dropped} dropped")
    return ", ".join(parts)


def _stage_line(s: StageView) -> str:
    text = s.status
    if s.calls:
        text += f" x{s.calls}"
    if s.out_shapes:
        text += f"  {shape_pattern(s.out_shapes)}"
    if s.dtypes:
        text += " " + "/".join(dtype(d) for d in s.dtypes)
    if s.note:
        text += f"  {s.note}"
    return text


def _stage_rows(dp: DataPath) -> list[tuple[str, str]]:
    rows = []
    for cap in dp.captures:
        rows.append(("capture", f"{cap.module}: enabled {cap.enabled}, boundaries {cap.boundaries} (ids {cap.requested_ids})"))
    for key, label in _STAGES:
        rows.append((label, _stage_line(getattr(dp, key))))
    return rows


def _acceptance_line(a: AcceptanceView) -> str:
    if a.overall_mean is None:
        return "no acceptance records"
    text = f"mean accept length {num(a.overall_mean)} over {a.requests} requests"
    if a.draft_tokens:
        text += f", {a.draft_tokens} draft tokens"
    if a.position_rate:
        # Draft positions from 1, as `spectrace view` numbers them (its "pos 1" bar).
        text += "; accepted at draft position " + " ".join(f"{i}:{r:.2f}" for i, r in enumerate(a.position_rate, 1))
    return text


def _summary_lines(t: LoadedTrace) -> list[str]:
    lines = [f"spectrace trace {t.source}", _headline(t)]
    lines += [f"! {line}" for line in t.view.header.not_closed + t.problems]
    lines += summary_lines(t.findings)
    lines.append("Data path")
    for label, text in _stage_rows(t.datapath):
        lines.append(f"  {label:<10} {text}")
    lines.append(f"Acceptance: {_acceptance_line(t.acceptance)}")
    lines.append(f"Modules: {len(t.modules)} (.modules; one row per call and tensor: .rows(), .to_pandas())")
    return lines


# -------------------------------------------------------------------------------- HTML
def _table(head: list[str], rows: list[list[str]]) -> str:
    # Every string from a trace is escaped: a module name or a message is data, never markup.
    th = "".join(f"<th style='text-align:left'>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td style='text-align:left'>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _html(t: LoadedTrace) -> str:
    out = [f"<div><p><b>spectrace trace</b> {html.escape(t.source)}<br>{html.escape(_headline(t))}</p>"]
    warn = t.view.header.not_closed + t.problems
    if warn:
        out.append("<ul>" + "".join(f"<li>{html.escape(w)}</li>" for w in warn) + "</ul>")
    if t.findings:
        out.append("<p><b>Findings</b></p>" + _table(list(TABLE_HEAD), table_rows(t.findings)))
    else:
        out.append("<p><b>Findings</b>: none</p>")
    out.append("<p><b>Data path</b></p>" + _table(["stage", "state"], [list(r) for r in _stage_rows(t.datapath)]))
    out.append(f"<p><b>Acceptance</b>: {html.escape(_acceptance_line(t.acceptance))}</p>")
    out.append(f"<p>Modules: {len(t.modules)} (<code>.rows()</code>, <code>.to_pandas()</code>)</p></div>")
    return "".join(out)
