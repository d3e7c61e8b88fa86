"""Rich renderables for a :class:`TraceView`: header, findings, data path, acceptance, modules.

Each part is one small class with ``__rich_console__``; data comes from :mod:`.model`
already derived, so nothing here computes a diagnosis. Everything fits 80 columns, and
the console from :func:`make_console` writes plain text when stdout is not a terminal
and honours ``NO_COLOR``. That console escapes every control character a trace's strings
carry (:mod:`.terminal`) and reads no markup in them: a module named ``[bold]`` is shown
as it is.

    >>> make_console(width=80).print(render_view(build_view(load_traces("traces/"))))
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable
from typing import IO

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.panel import Panel
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from spectrace.records import TensorStats

# The findings' words and their section are the presenter's; the viewer's other parts use them too.
from ..present.findings import plural, steps_text
from ..present.renderables import FindingsView
from ..present.renderables import no_wrap as _no_wrap
from .drops import drop_lines
from .fold import fold_layers
from .model import (
    NOT_IN_FILTER,
    AcceptanceView,
    DataPath,
    FcWidths,
    HeaderSummary,
    ModuleRow,
    MomentStats,
    ProcessInfo,
    SliceView,
    StageView,
    StatsSummary,
    TraceView,
)
from .terminal import SafeConsole, one_line, safe_console

BLOCKS = "▁▂▃▄▅▆▇█"
SPARK_WIDTH = 60
BAR_WIDTH = 40
_DTYPES = {"bfloat16": "bf16", "float16": "f16", "float32": "f32", "float64": "f64", "int64": "i64", "int32": "i32"}


def make_console(file: IO[str] | None = None, *, width: int | None = None, plain: bool = False) -> SafeConsole:
    """A console for the viewer; ``plain`` forces no colour and no terminal codes (tests, pipes)."""
    if plain:
        return safe_console(
            file=file or sys.stdout,
            markup=False,
            width=width or 80,
            color_system=None,
            force_terminal=False,
            no_color=True,
            highlight=False,
            emoji=False,
            soft_wrap=False,
            legacy_windows=False,
        )
    # rich already writes plain text to a non-terminal and reads NO_COLOR itself.
    return safe_console(file=file, width=width, highlight=False, emoji=False, markup=False)


# ------------------------------------------------------------------------------ helpers
def num(x: float | None) -> str:
    """Compact fixed-width-ish number: 3 significant digits, '-' when unknown."""
    if x is None:
        return "-"
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if x == 0:
        return "0"
    return f"{x:.3g}"


def shape(s: list[int]) -> str:
    return "[" + ",".join(str(d) for d in s) + "]"


def shapes(ss: list[list[int]], limit: int = 2) -> str:
    text = " ".join(shape(s) for s in ss[:limit])
    return text + (f" +{len(ss) - limit}" if len(ss) > limit else "")


def dtype(d: str) -> str:
    d = d.removeprefix("torch.")
    return _DTYPES.get(d, d)


def stats_text(s: TensorStats | StatsSummary | None) -> str:
    if s is None:
        return "no stats"
    text = f"mean {num(s.mean)} std {num(s.std)} absmax {num(s.absmax)}"
    if s.nan:
        text += f" nan {s.nan}"
    if s.inf:
        text += f" inf {s.inf}"
    return text


def sparkline(values: list[float], hi: float, width: int = SPARK_WIDTH) -> str:
    """Unicode block sparkline from 0..hi; more values than ``width`` are averaged into buckets."""
    if not values:
        return ""
    if len(values) > width:
        size = len(values) / width
        values = [
            sum(chunk) / len(chunk) for chunk in (values[int(i * size) : max(int((i + 1) * size), int(i * size) + 1)] for i in range(width))
        ]
    hi = hi or max(values) or 1.0
    return "".join(BLOCKS[min(len(BLOCKS) - 1, max(0, int(round(v / hi * (len(BLOCKS) - 1)))))] for v in values)


def bar(rate: float, width: int = BAR_WIDTH) -> str:
    filled = int(round(max(0.0, min(1.0, rate)) * width))
    return "█" * filled + "░" * (width - filled)


# ------------------------------------------------------------------------- renderables
def process_label(p: ProcessInfo, all_processes: list[ProcessInfo]) -> str:
    """``host:pid``; where another process has the same host, pid and rank (containers
    sharing a trace volume, each pid 1), its random id or its file name is added."""
    label = f"{p.host or '?'}:{p.pid if p.pid is not None else '?'}"
    twins = sum(1 for q in all_processes if (q.host, q.pid, q.rank) == (p.host, p.pid, p.rank))
    if twins > 1:
        label += f" ({'id ' + p.process_id if p.process_id else p.file})"
    return label


def same_process(processes: list[ProcessInfo]) -> list[list[ProcessInfo]]:
    """The trace files grouped by the process that wrote them: one process may write two
    (``SPECTRACE=1`` and a ``trace()`` inside it), told by the header's random id; files
    without one (older traces) stand alone."""
    groups: dict[tuple[object, ...], list[ProcessInfo]] = {}
    for p in processes:
        key = (p.host, p.pid, p.rank, p.process_id) if p.process_id else (p.file,)
        groups.setdefault(key, []).append(p)
    return list(groups.values())


class HeaderPanel:
    """Which run this is: processes, ranks, steps, time span, drops, coverage gaps, load problems."""

    def __init__(self, header: HeaderSummary) -> None:
        self.h = header

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        h = self.h
        lines = Text()
        groups = same_process(h.processes)
        firsts = [g[0] for g in groups]
        procs = ", ".join(
            process_label(g[0], firsts)
            + (f" rank {g[0].rank}" if g[0].rank is not None else "")
            + (f" ({len(g)} trace files)" if len(g) > 1 else "")
            for g in groups[:4]
        )
        if len(groups) > 4:
            procs += f", +{len(groups) - 4} more"
        lines.append(f"{len(groups)} process{'es' if len(groups) != 1 else ''}", style="bold")
        lines.append(f"  {procs}\n" if procs else "\n")
        if h.ranks:
            lines.append(f"ranks {', '.join(map(str, h.ranks))}   ")
        if h.step_first is not None:
            lines.append(f"{steps_text(h.step_first, h.step_last)} ({h.steps_traced} traced)")
        else:
            lines.append("no steps traced")
        if h.started:
            span = f", span {h.span_s:.1f} s" if h.span_s is not None else ""
            lines.append(f"\nstarted {h.started}{span}")
        for line in h.not_closed:
            lines.append("\n" + line, style="bold red" if ": not closed" in line else "yellow")
        lines.append("\nrecords dropped ")
        if h.not_closed:
            # Drop counts reach the file in its closing record: without it, no count is true.
            known = len(h.processes) - len(h.not_closed)
            lines.append(f"unknown ({len(h.not_closed)} of {len(h.processes)} files not closed)", style="bold red")
            if known and h.records_dropped:
                lines.append(f"; {h.records_dropped} in the closed ones")
        else:
            lines.append(str(h.records_dropped), style="bold red" if h.records_dropped else "green")
        # Each drop by the reason its writer recorded: a full disk is not a full queue.
        for why in drop_lines(h.dropped_by_reason, h.records_dropped) if h.records_dropped else []:
            lines.append("\n  " + why)
        if h.hook_calls:
            lines.append("\nspectrace's own host time: ")
            if h.hook_us_per_call is not None:
                lines.append(f"{h.hook_us_per_call} us per hook call in steady state ({plural(h.hook_steady_calls, 'call')})")
                if h.hook_us_per_verify_step is not None:
                    lines.append(f", {h.hook_us_per_verify_step} us per verify step")
                if h.hook_us_per_verify_step_in_slow_calls:
                    slow = h.hook_us_per_verify_step_in_slow_calls
                    lines.append(f" ({slow} of it in calls over 100 us: the thread lost the CPU or waited)")
            else:
                lines.append("start-up only so far")
            if h.hook_startup_calls or h.hook_startup_ms:
                # Paid once (graph capture, first calls), never a per-step cost: said apart.
                took = f"{h.hook_startup_ms} ms" if h.hook_startup_ms is not None else "?"
                lines.append(f"\n  start-up, paid once: {took} in {plural(h.hook_startup_calls, 'call')} (graph capture, first calls)")
            if h.hook_us_per_verify_step_by_feature:
                split = ", ".join(f"{name} {us}" for name, us in h.hook_us_per_verify_step_by_feature.items())
                lines.append(f"\n  us per verify step by hook: {split}")
        if h.graph_traced:
            lines.append("\ngraph replays: ", style="green")
            lines.append(h.graph_traced)
        for values in h.values:
            lines.append("\nvalues captured: ", style="yellow")
            lines.append(f"{values}, user data: keep it private")
        for gap in h.coverage_gaps:
            lines.append("\nnot seen: ", style="yellow")
            lines.append(gap)
        for problem in h.load_problems:
            lines.append("\nload: ", style="red")
            lines.append(problem)
        # A str title is read as markup: the path is the user's, so it goes in as Text.
        yield Panel(lines, title=Text(f"spectrace  {_short(h.source)}"), title_align="left", box=box.ROUNDED)


MAX_MODULE_ROWS = 200  # module table rows drawn (after folding repeated layers)


class DataPathTree:
    """The EAGLE-3 data path as a tree: capture -> aux concat -> fc -> decoder layer -> norm
    -> lm_head (+ the target's logits, d2t).

    Each stage is one line (calls, module, shapes, dtype) and one row per forward mode:
    records, graph replays among them, real token rows, and mean/std/absmax over the whole
    run, then std/absmax over the last N traced steps. Aggregates only: one screen.
    """

    def __init__(self, dp: DataPath) -> None:
        self.dp = dp

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        dp = self.dp
        stages = (dp.aux, dp.fc, dp.layer, dp.norm, dp.lm_head, dp.target_lm_head)
        label = Text("EAGLE-3 data path", style="bold")
        if any(s.total for s in stages):
            # "whole run │ last N steps" over the columns it names (the bar lines up).
            where = f"  window: {steps_text(dp.window_first_step, dp.window_last_step)}" if dp.window_first_step is not None else ""
            head = "whole run │ "
            pad = len(ROW_INDENT) + len(_row_head().split("│")[0]) - len(head) + 2
            label.append(where.ljust(max(1, pad - len(label.plain))), style="dim")
            label.append(f"{head}last {dp.window_steps} steps", style="dim")
            label.append("\n" + ROW_INDENT + _row_head(), style="dim")
        tree = Tree(label, guide_style="dim")
        if dp.captures:
            for c in dp.captures:
                t = Text("target capture  ", style="bold")
                if not c.enabled:
                    t.append("DISABLED  ", style="bold red")
                t.append(f"boundaries {c.boundaries}")
                if c.requested_ids is not None:
                    t.append(f" from ids {c.requested_ids}")
                note = ""
                for b in c.layers:
                    name = f"b{b.boundary} " + ("embed" if b.boundary == 0 else f"layer {b.boundary - 1}")
                    t.append("\n" + (_row(name, b.total) if b.total else f"{name:<{LABEL_W}} not seen"))
                    if b.boundary == 0 and b.stats_from:
                        note = f"b0: statistics of {b.stats_from} (an embedding row identifies its token)"
                    elif b.boundary == 0 and b.total and b.total.run.output is None:
                        note = "b0: no statistics by default: an embedding row identifies its token"
                node = tree.add(_no_wrap(t))
                if note:
                    node.add(Text(note, style="dim"))
                width = (
                    f"hidden {c.hidden_size} x {len(c.boundaries)} = {c.hidden_size * len(c.boundaries)}"
                    if c.boundaries
                    else f"hidden {c.hidden_size}, no boundary captured"
                )
                node.add(Text(f"{c.module}: {plural(c.num_layers, 'layer')}, {width}; rule: {c.rule}", style="dim"))
        elif dp.module_filter:
            tree.add(Text(f"target capture  {NOT_IN_FILTER}", style="dim"))
        else:
            tree.add(Text("target capture  no capture record", style="yellow"))
        t = _stage_text("aux concat", dp.aux)
        for ch in dp.aux.chunks:
            name = f"chunk {ch.index} " + (f"b{ch.boundary}" if ch.boundary is not None else "b?")
            t.append("\n" + _row(name, ch.total), style="bold red" if ch.flags else "")
        aux = tree.add(_no_wrap(t))
        for ch in dp.aux.chunks:
            if ch.flags:
                aux.add(Text(f"chunk {ch.index}: " + "; ".join(ch.flags), style="bold red"))
        _stage_details(aux, dp.aux)
        for fp in dp.fingerprints:
            node = aux.add(Text(f"chunks of {fp.chunk_width} ({fp.module}, {plural(fp.samples, 'sample')})"))
            for fch in fp.chunks:
                ft = Text(f"{fch.index}  ")
                ft.append(f"b{fch.boundary}" if fch.boundary is not None else "b?", style="bold")
                if fch.boundary == 0:
                    ft.append(" (embedding)")
                ft.append(f"  {stats_text(fch.stats)}")
                if fch.flags:
                    ft.append("  " + "; ".join(fch.flags), style="bold red")
                node.add(ft)
        fc = _stage_text("fc", dp.fc, widths=dp.fc.widths)
        if dp.fc.total and dp.fc.total.run.input:
            fc.append("\n" + _row("input (all)", dp.fc.total, side="input"), style="dim")
        _stage_details(tree.add(_no_wrap(fc)), dp.fc)
        for name, stage in (("decoder layer", dp.layer), ("norm", dp.norm), ("lm_head", dp.lm_head)):
            _stage_details(tree.add(_no_wrap(_stage_text(name, stage))), stage)
        if dp.target_lm_head.total or (dp.roles and dp.lm_head.total):
            _stage_details(tree.add(_no_wrap(_stage_text("target lm_head", dp.target_lm_head))), dp.target_lm_head)
        d2t = Text("d2t  ", style="bold")
        d2t.append(dp.d2t.status, style=_status_style(dp.d2t.status))
        if dp.d2t.modules:
            d2t.append(f"  ({', '.join(dp.d2t.modules)})", style="dim")
        if dp.draft_vocab is not None:
            vocab = f"  draft vocab {dp.draft_vocab}"
            if dp.target_vocab is not None:
                vocab += f" -> target vocab {dp.target_vocab}"
            d2t.append(vocab)
        node = tree.add(d2t)
        if dp.d2t.note:
            node.add(Text(dp.d2t.note, style="dim"))
        yield tree
        if any(s.total for s in stages):
            yield Text(COLUMNS_LEGEND, style="dim")


# The rows of a stage: columns that line up across stages under one heading line.
LABEL_W = 13  # TARGET_VERIFY
ROW_INDENT = "    "  # where a tree node's second label line starts


# What the columns of _row_head mean, said once under the tree.
COLUMNS_LEGEND = (
    "recs: records; graph: of them from CUDA-graph replays; rows: real (unpadded) token rows; "
    "mean std absmax: all of a row's outputs as one tensor"
)


def _row_head() -> str:
    return f"{'mode':<{LABEL_W}} {'recs':>5} {'graph':>5} {'rows':>6} {'mean':>7} {'std':>7} {'absmax':>7} │ {'std':>7} {'absmax':>7}"


def _row(label: str, sl: SliceView, side: str = "output") -> str:
    """One slice as one row: counts, then whole-run mean/std/absmax, then the window's std/absmax."""
    run = sl.run
    r: MomentStats | None = getattr(run, side)
    w: MomentStats | None = getattr(sl.window, side)
    text = (
        f"{label[:LABEL_W]:<{LABEL_W}} {count(run.records):>5} {count(run.graph_replay):>5} "
        f"{count(run.rows) if run.rows is not None else '-':>6} "
        f"{short(r.mean if r else None):>7} {short(r.std if r else None):>7} {short(r.absmax if r else None):>7} │ "
    )
    text += f"{short(w.std if w else None):>7} {short(w.absmax if w else None):>7}" if sl.window.records else f"{'-':>7} {'-':>7}"
    if (r and (r.nan or r.inf)) or (w and (w.nan or w.inf)):
        text += " !"
    return text


def count(n: int) -> str:
    """A count in at most 5 characters: 12345, 123k, 1.2M."""
    if n < 100_000:
        return str(n)
    if n < 1_000_000:
        return f"{n // 1000}k"
    return f"{n / 1e6:.1f}M" if n < 100_000_000 else f"{n // 1_000_000}M"


def short(x: float | None, width: int = 7) -> str:
    """A number in at most ``width`` characters: 3 significant digits, fewer when it must."""
    if x is None:
        return "-"
    if not math.isfinite(x):
        return str(x)
    if x == 0:
        return "0"
    text = f"{x:.3g}"
    if len(text) <= width and "e" not in text:
        return text
    for digits in (3, 2, 1):
        mant, exp = f"{x:.{digits - 1}e}".split("e")
        text = f"{mant}e{int(exp)}"
        if len(text) <= width:
            return text
    return text


def shape_pattern(ss: list[list[int]]) -> str:
    """Shapes as one: a dimension that varies reads min..max (``[4..16,192]``); shapes of
    different ranks read one pattern per rank (``[4..16] [4..16,64]``), never a bare count."""
    if not ss:
        return ""
    ranks = sorted({len(s) for s in ss})
    if len(ranks) != 1:
        parts = [shape_pattern([s for s in ss if len(s) == r]) for r in ranks[:2]]
        more = sum(1 for s in ss if len(s) in ranks[2:])
        return " ".join(parts) + (f" +{plural(more, 'other shape')}" if more else "")
    dims = []
    for i in range(len(ss[0])):
        vals = [s[i] for s in ss]
        lo, hi = min(vals), max(vals)
        dims.append(str(lo) if lo == hi else f"{lo}..{hi}")
    return "[" + ",".join(dims) + "]"


def _status_style(status: str) -> str:
    if status in ("called", "loaded"):
        return "green"
    if status in ("bypassed", "missing", "ignored", "disabled"):
        return "bold red"
    if status == NOT_IN_FILTER:
        return "dim"
    return "yellow"


def _stage_text(label: str, s: StageView, widths: FcWidths | None = None) -> Text:
    """The stage's line (status, calls, module, shapes, dtype) and one row per forward mode."""
    t = Text(f"{label}  ", style="bold")
    if s.status == "called":
        t.append(f"x{s.calls}  ", style="green")
    else:
        t.append(s.status.upper() if s.status in ("bypassed", "disabled") else s.status, style=_status_style(s.status))
        if s.calls:
            t.append(f"  x{s.calls}")
        if s.modules:
            t.append("  ")
    io = ""
    if s.calls:
        io = f"{shape_pattern(s.in_shapes)} -> " if s.in_shapes else ""
        io += f"{shape_pattern(s.out_shapes)} {' '.join(dtype(d) for d in s.dtypes)}".rstrip()
    if s.modules:
        room = MAX_LINE - len(t.plain) - (len(io) + 2 if io else 0) - (4 if len(s.modules) > 1 else 0)
        name = s.modules[0]
        if room < 12:  # the shapes go on their own line
            room, io = MAX_LINE - len(t.plain), "\n" + ROW_INDENT[:0] + io if io else ""
        t.append(name if len(name) <= room else "…" + name[-(room - 1) :])
        if len(s.modules) > 1:
            t.append(f" +{len(s.modules) - 1}")
    if io:
        t.append(("  " if not io.startswith("\n") else "") + io)
    if widths is not None and (widths.in_widths or widths.in_features):
        t.append("\n")
        t.append(_widths_text(widths), style="bold red" if widths.verdict in ("bypass", "mismatch") else "")
    for sl in s.modes:
        t.append("\n" + _row(sl.label, sl))
    if s.draft_steps:
        t.append("\n" + _draft_steps_text(s.draft_steps), style="dim")
    return t


MAX_LINE = 76  # 80 columns less the tree's guide


def _widths_text(w: FcWidths) -> str:
    """``input width 64 = hidden 64, fc in_features 192: fc skipped`` (the fc-bypass bug)."""
    seen = "/".join(map(str, w.in_widths)) or "?"
    feats = str(w.in_features) if w.in_features is not None else "?"
    if w.in_features_from == "capture (expected)":
        feats += " expected"
    hidden = w.hidden if w.hidden is not None else "?"
    if w.verdict == "bypass":
        return f"input width {seen} = hidden {hidden}, fc in_features {feats}: fc BYPASSED"
    if w.verdict == "mismatch":
        return f"input width {seen} != fc in_features {feats} (hidden {hidden}): MISMATCH"
    if w.verdict == "ok" and isinstance(w.hidden, int) and w.hidden and w.in_features and w.in_features % w.hidden == 0:
        return f"input width {seen} = fc in_features {feats} (hidden {hidden} x {w.in_features // w.hidden})"
    return f"input width {seen}, fc in_features {feats}, hidden {hidden}"


def _draft_steps_text(steps: list[SliceView]) -> str:
    """``draft steps std/absmax  0 x40 1.1/4.4  1 x40 ...``, as many as fit."""
    text = "draft steps std/absmax"
    for i, sl in enumerate(steps):
        o = sl.run.output
        part = f"  {sl.draft_step} x{count(sl.run.records)} {short(o.std if o else None)}/{short(o.absmax if o else None)}"
        if len(text) + len(part) > MAX_LINE - 4 and i < len(steps) - 1:
            return text + f"  +{len(steps) - i}"
        text += part
    return text


def _stage_details(node: Tree, s: StageView) -> None:
    if s.note:
        node.add(Text(s.note, style="red" if s.status == "bypassed" else "dim"))
    if s.anomalies:
        node.add(Text("anomaly: " + ", ".join(s.anomalies), style="bold red"))


class AcceptancePanel:
    """Accept length over steps (sparkline) and acceptance rate per draft position (bars)."""

    def __init__(self, acc: AcceptanceView) -> None:
        self.acc = acc

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        a = self.acc
        if a.draft_tokens is None:
            yield Text("Acceptance: no acceptance records", style="dim")
            return
        head = Text("Acceptance  ", style="bold")
        if a.overall_mean is None:  # records, but none named a request
            head.append(f"no requests in the acceptance records, k={a.draft_tokens}", style="dim")
            yield head
            return
        head.append(f"mean accept length {a.overall_mean:.2f}", style="bold")
        head.append(f" over {plural(len(a.steps), 'step')}, {plural(a.requests, 'request')}, k={a.draft_tokens}")
        yield head
        if a.steps:  # (empty when every step is past the per-step cap: totals only)
            hi = max([float((a.draft_tokens or 0) + 1)] + a.mean_accept)
            per = max(1, math.ceil(len(a.mean_accept) / SPARK_WIDTH))
            yield Text(f"   {sparkline(a.mean_accept, hi)}", style="cyan")
            yield Text(
                f"   {steps_text(a.steps[0], a.steps[-1])}, min {min(a.mean_accept):.2f} max {max(a.mean_accept):.2f}"
                f", scale 0..{hi:g}" + (f", {per} steps per cell" if per > 1 else ""),
                style="dim",
            )
        for i, rate in enumerate(a.position_rate):
            t = Text(f"   pos {i + 1:<2} ")
            t.append(bar(rate), style="cyan")
            t.append(f" {rate * 100:5.1f}%")
            yield t


class ModuleTable:
    """Per module: calls, output shape, dtype, mean/std/absmax and what is wrong with them.

    ``types`` adds each module's class: the table is the whole view of a plain model (no
    EAGLE-3 pair), where the class is what tells a layer from a norm.
    """

    def __init__(self, rows: list[ModuleRow], *, types: bool = False, fold: bool = True, max_rows: int | None = None) -> None:
        # Repeated layers fold into one row (fold.py); past max_rows one line says how many
        # more modules --module or --json show: a screen, whatever the model's depth.
        self.rows = fold_layers(rows) if fold else rows
        self.folded = len(self.rows) < len(rows)
        self.types = types
        self.max_rows = MAX_MODULE_ROWS if max_rows is None else max_rows

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if not self.rows:
            yield Text("Modules: no calls recorded (or none match the filter)", style="dim")
            return
        title, root = "Modules", ""
        if self.types:
            # One root for every row (the model's class under SPECTRACE=1) is said once, in
            # the title, so the names that tell the modules apart fit 80 columns.
            roots = {r.module.split(".", 1)[0] for r in self.rows}
            if len(roots) == 1 and all("." in r.module for r in self.rows):
                root = roots.pop() + "."
            title = f"Modules{' of ' + root[:-1] if root else ''}: no EAGLE-3 draft traced, one row per module"
        # Narrow screens give the type a line under the module's name, wide ones a column.
        type_column = self.types and options.max_width >= 100
        table = Table(
            box=box.SIMPLE_HEAD,
            title=Text(title),
            title_justify="left",
            pad_edge=False,
            expand=False,
            padding=(0, 1, 0, 0) if self.types else (0, 1),
        )
        table.add_column(
            "module" if type_column or not self.types else "module / type", overflow="fold", ratio=1, min_width=14 if self.types else 16
        )
        if type_column:
            table.add_column("type", overflow="fold", max_width=20)
        table.add_column("calls", justify="right", no_wrap=True)
        table.add_column("out", overflow="fold", max_width=14)
        table.add_column("dt", no_wrap=True)
        table.add_column("mean", justify="right", no_wrap=True)
        table.add_column("std", justify="right", no_wrap=True)
        table.add_column("absmax", justify="right", no_wrap=True)
        table.add_column("!", style="bold red", overflow="fold", max_width=10)
        fmt = short if self.types else num  # short: at most 7 characters, to fit the type column
        for r in self.rows[: self.max_rows]:
            name = Text(one_line(r.module.removeprefix(root)))  # Text: a str cell is read as markup
            if self.types and not type_column and r.module_type:
                name.append("\n" + r.module_type, style="dim")
            cells: list[Text | str] = [name]
            if type_column:
                cells.append(Text(r.module_type))
            cells += [
                str(r.calls),
                shape_pattern(r.out_shapes),
                Text(" ".join(dtype(d) for d in r.dtypes)),
                *(fmt(x) for x in (r.agg.mean, r.agg.std, r.agg.absmax)),
                ",".join(r.anomalies),
            ]
            table.add_row(*cells)
        yield table
        if self.folded:
            yield Text("repeated layers are one row each: --all-layers shows every layer", style="dim")
        if len(self.rows) > self.max_rows:
            left = len(self.rows) - self.max_rows
            yield Text(f"… {plural(left, 'more row')}: --module GLOB or --json", style="bold yellow")


def render_view(view: TraceView, *, modules: bool = False, all_layers: bool = False) -> Group:
    """The whole screen, top to bottom.

    An EAGLE-3 pair gets its data path and acceptance; a plain model gets the module table
    in their place (acceptance only where it was recorded), so no draft stage reads as missing.
    """
    parts: list[object] = [HeaderPanel(view.header)]
    if view.filter_problem:  # --follow shows it; a plain view exits 2 on it instead
        parts.append(Text(view.filter_problem, style="bold yellow"))
    parts += [FindingsView(view.findings), Text("")]
    if not view.datapath.eagle3:
        parts.append(ModuleTable(view.modules, types=True, fold=not all_layers))
        if view.acceptance.draft_tokens is not None:
            parts += [Text(""), AcceptancePanel(view.acceptance)]
        return Group(*parts)  # type: ignore[arg-type]
    parts += [DataPathTree(view.datapath), Text(""), AcceptancePanel(view.acceptance)]
    if modules:
        parts += [Text(""), ModuleTable(view.modules, fold=not all_layers)]
    return Group(*parts)  # type: ignore[arg-type]


def _short(path: str, limit: int = 56) -> str:
    return path if len(path) <= limit else "..." + path[-(limit - 3) :]


def iter_lines(renderable: object, width: int = 80) -> Iterable[str]:
    """Plain-text lines of a renderable (for paging decisions and tests)."""
    import io

    buf = io.StringIO()
    make_console(buf, width=width, plain=True).print(renderable)
    return buf.getvalue().splitlines()
