"""The live screen of ``spectrace view --follow``: what a running server is doing now.

Top to bottom, cut to the terminal's height:

1. a status line: the trace's state (open, closed, not closed), steps so far, the accept
   length now (over the live check's window) against the whole run's, records dropped so
   far, and verify steps per second;
2. what is new: finding codes, stages and forward modes seen for the first time, a change
   in the accept length, files opened or closed; each stays :data:`NEW_HOLD_S` seconds, so
   a change is on screen long enough to be read;
3. the findings, one line each; a new one (and a live one) also gets its fix;
4. acceptance, then the data path (or a plain model's module table), cut where the
   screen ends, with a line saying how much more there is.

Live symptoms come from :class:`spectrace.checks.acceptance_live.LiveAcceptance`, fed the
verify steps as they arrive: this module shows its findings, it makes none.

    >>> screen = LiveScreen("traces/")
    >>> screen.update(builder.build(follower.trace_set))
    >>> console.print(screen.frame())
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from collections.abc import Callable, Iterable

from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.segment import Segment
from rich.text import Text

from spectrace.checks.acceptance_live import LiveAcceptance, VerifyStep
from spectrace.records import Finding
from spectrace.rules.catalogue import CATALOGUE

from ..checks.root_causes import root_causes
from ..present.findings import SEVERITY_STYLE, blocks, headline, more_codes, more_consequences, when
from ..present.renderables import detail_line, finding_line, fix_row
from .model import FindingGroup, TraceView, ViewFilter
from .render import AcceptancePanel, DataPathTree, ModuleTable

NEW_HOLD_S = 30.0  # how long a change stays in the "new" section
MAX_NEW = 6  # lines of the "new" section
MAX_ROOTS = 6  # root causes on the live screen (each: its line, its fix, its consequences)
MAX_BENEATH = 3  # consequences drawn beneath one root
RATE_SPAN_S = 5.0  # steps per second over this much of the recent past
REDRAW_S = 1.0  # redraw this often without new records: ages and the rate move on
# A change in the accept length now worth a line: this much, or this part of the old value.
ACCEPT_CHANGE = 0.5
ACCEPT_CHANGE_PART = 0.25
ACCEPT_SETTLE_S = 10.0  # changes this close together are one change (the window sliding through it)
STAGES = ("aux", "fc", "layer", "norm", "lm_head", "target_lm_head", "d2t")
STAGE_NAMES = {"aux": "aux concat", "layer": "decoder layer", "target_lm_head": "target lm_head"}
LIVE_NOTE = "from the acceptance records as they arrive; the writer has not said it"
# What the writer says instead of a collapse over the same steps: the live one then goes.
_INSTEAD_OF_COLLAPSE = ("acceptance_sampled", "acceptance_synthetic")


class NewItem:
    """One change, and when it was seen (the screen's clock)."""

    __slots__ = ("at", "style", "text")

    def __init__(self, at: float, text: str, style: str = "") -> None:
        self.at = at
        self.text = text
        self.style = style


class LiveScreen:
    """The state ``--follow`` keeps between refreshes, and the frame it draws from it.

    :meth:`update` takes each new view (built incrementally by the view builder): it feeds
    the verify steps that arrived to the live acceptance check and notes what changed.
    :meth:`frame` draws the screen. The first view is the baseline: what a trace already
    holds when the screen opens is not new.
    """

    def __init__(
        self,
        path: str,
        flt: ViewFilter | None = None,
        *,
        modules: bool = False,
        clock: Callable[[], float] = time.monotonic,
        hold_s: float = NEW_HOLD_S,
    ) -> None:
        self.path = path
        self.flt = flt or ViewFilter()
        self.modules = modules
        self.clock = clock
        self.hold_s = hold_s
        self.live = LiveAcceptance()
        self.view: TraceView | None = None
        self.notices: list[str] = []
        self.new: deque[NewItem] = deque(maxlen=64)
        self.drawn_at: float | None = None
        self._rate: deque[tuple[float, int]] = deque()
        self._baseline = False
        self._codes: set[tuple[str, str]] = set()
        self._new_codes: dict[str, float] = {}  # code -> when it appeared
        self._stages: dict[str, str] = {}
        self._modes: set[tuple[str, str]] = set()
        self._captures: dict[str, tuple[tuple[int, ...], bool]] = {}
        self._files: dict[str, str] = {}
        self._accept_ref: float | None = None
        self._accept_item: NewItem | None = None
        self._accept_from = 0.0
        self._live_said = False
        self._fed_through: int | None = None

    # ------------------------------------------------------------------------ update
    def update(self, view: TraceView, notices: Iterable[str] = ()) -> None:
        """Take the newest view; ``notices`` are the follower's (a file read again from the start)."""
        now = self.clock()
        notices = list(notices)
        if len(notices) > len(self.notices):
            # A file read again from the start: its steps start over, and so does the window.
            if self.view is not None:
                self.live = LiveAcceptance()
                self._fed_through = None
                self._accept_ref = None
                self._accept_item = None
                self._live_said = False
            for notice in notices[len(self.notices) :]:
                self._note(now, notice, "bold yellow")
        self.notices = notices
        self._feed_acceptance(view)
        self._rate.append((now, view.header.steps_traced))
        while len(self._rate) > 2 and now - self._rate[1][0] >= RATE_SPAN_S:
            self._rate.popleft()  # one sample older than the span is kept: where the rate starts
        self._diff(view, now)
        self._baseline = True
        self.view = view

    def _feed_acceptance(self, view: TraceView) -> None:
        acc = view.acceptance
        if not acc.steps:
            return
        # A step is complete once a later one is there, or when every writer has closed:
        # the records of the newest step may still be arriving.
        closed = bool(view.header.processes) and all(p.state == "closed" for p in view.header.processes)
        end = len(acc.steps) if closed else len(acc.steps) - 1
        start = 0 if self._fed_through is None else bisect.bisect_right(acc.steps, self._fed_through)
        k = acc.draft_tokens or 0
        for i in range(start, end):
            self.live.observe(VerifyStep(acc.steps[i], acc.mean_accept[i], k, requests=acc.batch[i] if i < len(acc.batch) else 0))
        if end > start:
            self._fed_through = acc.steps[end - 1]

    def _note(self, now: float, text: str, style: str = "") -> None:
        self.new.append(NewItem(now, text, style))

    def _diff(self, view: TraceView, now: float) -> None:
        """Note what changed since the previous view (nothing for the first one: the baseline)."""
        note = self._note if self._baseline else (lambda *_: None)
        for g in view.findings:
            key = (g.code, g.severity)
            if key not in self._codes:
                self._codes.add(key)
                if self._baseline:
                    self._new_codes[g.code] = now
                note(now, f"finding {g.code} ({g.severity}), {_where(g)}", SEVERITY_STYLE.get(g.severity, ""))
        live = self.live_finding(view)
        if live is not None and not self._live_said:
            self._live_said = True
            self._new_codes.setdefault(live.code, now)
            note(now, f"{live.code} (live), from the last {self.live.size} verify steps", "bold yellow")
        for p in view.header.processes:
            state = "open" if p.state == "running" else p.state
            before = self._files.get(p.file)
            if before is None:
                note(now, f"trace file {p.file} ({state})")
            elif before != state:
                note(now, f"{p.file}: {before} -> {state}", "bold" if state == "closed" else "bold red")
            self._files[p.file] = state
        dp = view.datapath
        for c in dp.captures:
            shape = (tuple(c.boundaries), c.enabled)
            before_capture = self._captures.get(c.module)
            if before_capture is not None and before_capture != shape:
                note(now, f"capture {c.module}: boundaries {list(shape[0])}" + ("" if c.enabled else " DISABLED"), "bold")
            self._captures[c.module] = shape
        appeared: list[str] = []
        modes: dict[str, list[str]] = {}
        for name in STAGES:
            stage = getattr(dp, name)
            label = STAGE_NAMES.get(name, name)
            before_status = self._stages.get(name)
            if before_status == "not seen" and stage.status != "not seen":
                appeared.append(f"{label} ({stage.status})")
            elif before_status is not None and before_status != stage.status:
                note(now, f"{label}: {before_status} -> {stage.status}", _status_style(stage.status))
            self._stages[name] = stage.status
            for mode in stage.modes:
                if mode.forward_mode and (name, mode.forward_mode) not in self._modes:
                    self._modes.add((name, mode.forward_mode))
                    modes.setdefault(mode.forward_mode, []).append(label)
        # One line for the stages that showed up together, one per new forward mode.
        if appeared:
            note(now, "stages seen: " + ", ".join(appeared))
        for mode, labels in modes.items():
            note(now, f"mode {mode} seen: " + ", ".join(labels))
        now_accept = self.live.now
        if now_accept is not None and len(self.live.window) >= self.live.size:
            ref = self._accept_ref
            if ref is None:
                self._accept_ref = now_accept
            elif abs(now_accept - ref) >= max(ACCEPT_CHANGE, ACCEPT_CHANGE_PART * ref):
                self._accept_ref = now_accept
                self._accept_changed(now, ref, now_accept)

    def _accept_changed(self, now: float, ref: float, value: float) -> None:
        """A change in the accept length now: while the window slides through a change it
        moves at every refresh; one line follows it (from where it started) rather than many."""
        item = self._accept_item
        if item is not None and now - item.at <= ACCEPT_SETTLE_S and item in self.new:
            self.new.remove(item)
            ref = self._accept_from
        else:
            self._accept_from = ref
        self._accept_item = item = NewItem(
            now, f"accept length now {ref:.2f} -> {value:.2f} (last {self.live.size} steps)", "bold red" if value < ref else "green"
        )
        if self._baseline:
            self.new.append(item)

    # ------------------------------------------------------------------------ reading
    def live_finding(self, view: TraceView | None = None) -> Finding | None:
        """The live check's finding, unless the writer has said that code itself (its own
        finding then stands) or a finding that judges the same low acceptance otherwise
        (sampling or simulation explains it: the writer read the requests' sampling, which
        the folded steps here do not hold), or the filters hide it."""
        view = view or self.view
        found = self.live.finding
        if found is None or view is None:
            return None
        said = {found.code, *(_INSTEAD_OF_COLLAPSE if found.code == "acceptance_collapse" else ())}
        if any(g.code in said for g in view.findings):
            return None
        flt = self.flt
        if (flt.finding and flt.finding != found.code) or not flt.finding_ok(found):
            return None
        return found

    def live_findings(self) -> list[Finding]:
        """The live findings shown now (empty or one: the live acceptance check's)."""
        found = self.live_finding()
        return [found] if found is not None else []

    def rate(self) -> float | None:
        """Steps per second over the last :data:`RATE_SPAN_S` (0 once nothing came that long)."""
        if len(self._rate) < 2:
            return None
        now = self.clock()
        # From the newest sample at least RATE_SPAN_S old (the oldest one, early on) to now.
        older = [sample for sample in self._rate if now - sample[0] >= RATE_SPAN_S]
        t0, s0 = older[-1] if older else self._rate[0]
        span = now - t0
        return (self._rate[-1][1] - s0) / span if span > 0 else None

    def due(self) -> bool:
        """A redraw is due without new records (the ages and the rate move on)."""
        return self.drawn_at is None or self.clock() - self.drawn_at >= REDRAW_S

    # ------------------------------------------------------------------------ drawing
    def frame(self, height: int | None = None) -> FollowFrame:
        """The screen for the newest view; ``height`` defaults to the console's."""
        view = self.view
        if view is None:
            raise ValueError("LiveScreen.frame() before update()")
        self.drawn_at = self.clock()
        top: list[RenderableType] = [self.status_line(view), self._banner(view), *self._new_section(), Text("")]
        top += self._findings(view)
        rest: list[RenderableType] = [Text("")]
        if view.acceptance.draft_tokens is not None or view.datapath.eagle3:
            rest += [AcceptancePanel(view.acceptance), Text("")]
        if view.datapath.eagle3:
            rest.append(DataPathTree(view.datapath))
            if self.modules:
                rest += [Text(""), ModuleTable(view.modules)]
        else:
            rest.append(ModuleTable(view.modules, types=True))
        return FollowFrame(top, rest, height=height, hint=f"spectrace view {self.path} shows all of it")

    def status_line(self, view: TraceView) -> StatusLine:
        """State, steps, accept length now and over the run, records dropped, steps per second."""
        h = view.header
        states = [p.state for p in h.processes]
        fields: list[Text] = []
        if "running" in states:
            state = Text(" open ", style="reverse green")
        elif "not closed" in states:
            state = Text(" not closed ", style="reverse red")
        elif states:
            state = Text(" closed ", style="reverse")
        else:
            state = Text(" no trace ", style="reverse yellow")
        if len(states) > 1:
            state.append(f" {states.count('running')}/{len(states)} files open", style="")
        fields.append(state)
        steps = Text("steps ", style="bold")
        if h.step_first is not None:
            span = f"{h.step_first}" if h.step_first == h.step_last else f"{h.step_first}..{h.step_last}"
            steps.append(span)
            if h.step_last is not None and h.steps_traced != h.step_last - h.step_first + 1:  # said only when some went untraced
                steps.append(f" ({h.steps_traced} traced)")
        else:
            steps.append("none yet")
        fields.append(steps)
        now, run = self.live.now, view.acceptance.overall_mean
        if now is not None or run is not None:
            accept = Text("accept now ", style="bold")
            accept.append("-" if now is None else f"{now:.2f}", style="bold red" if self.live.finding else "bold")
            accept.append(f" / run {'-' if run is None else f'{run:.2f}'}")
            fields.append(accept)
        dropped = Text("dropped ", style="bold")
        dropped.append(str(h.records_dropped), style="bold red" if h.records_dropped else "green")
        if h.not_closed:
            dropped.append(" so far")  # the final count comes with the closing record
        fields.append(dropped)
        rate = self.rate() if "running" in states else None  # a closed trace has no pace
        if rate is not None:
            fields.append(Text(f"{rate:.1f} steps/s"))
        return StatusLine(fields)

    def _banner(self, view: TraceView) -> Text:
        lines = sum(p.records for p in view.header.processes)
        t = Text(
            f"following {self.path}: {lines} records; accept now: the last {self.live.size} verify steps; Ctrl-C quits",
            style="dim",
            no_wrap=True,
            overflow="ellipsis",
        )
        extra = [*self.notices[-1:], *([view.filter_problem] if view.filter_problem else []), *view.header.load_problems[:2]]
        for line in extra:
            t.append("\n" + line, style="bold yellow")
        return t

    def _new_section(self) -> list[RenderableType]:
        now = self.clock()
        recent = [n for n in self.new if now - n.at <= self.hold_s]
        if not recent:
            return [Text(f"New: nothing in the last {self.hold_s:g} s", style="dim")]
        out: list[RenderableType] = [Text(f"New in the last {self.hold_s:g} s", style="bold")]
        shown = recent[-MAX_NEW:][::-1]  # newest first
        for n in shown:
            t = Text(f"  {_age(now - n.at):>6}  ", style="dim", no_wrap=True, overflow="ellipsis")
            t.append(n.text, style=n.style or "")
            out.append(t)
        if len(recent) > len(shown):
            out.append(Text(f"  +{len(recent) - len(shown)} more", style="dim"))
        return out

    def _findings(self, view: TraceView) -> list[RenderableType]:
        now = self.clock()
        live = self.live_finding(view)
        groups = list(view.findings)
        if not groups and live is None:
            return [Text("Findings: none", style="green")]
        n = len(groups) + (live is not None)
        errors = sum(1 for g in groups if g.severity == "error")
        # Which root the live symptom follows from: the checks judge it with the rest.
        live_root = root_causes([*groups, live])[-1].root if live is not None else None
        follow = sum(1 for g in groups if g.root is not None) + (live_root is not None)
        # Counted as roots here: those with a consequence on this screen (the live one included).
        roots = len({g.root for g in groups if g.root is not None} | ({live_root} if live_root else set()))
        head = Text(headline(n, errors, roots, follow), style="bold", no_wrap=True, overflow="ellipsis")
        out: list[RenderableType] = [head]
        # A consequence whose root is not on screen is left out here (spectrace view shows it).
        drawn = blocks(groups, orphans=False)
        for b in drawn[:MAX_ROOTS]:
            g = b.head
            fresh = now - self._new_codes.get(g.code, -1e18) <= self.hold_s
            out.append(finding_line(g.severity, g.code, _where(g), g.message, new=fresh))
            # Every root's fix, whole (wrapped under itself): what to do is the screen's point.
            out.append(fix_row(g.fix))
            for c in b.beneath[:MAX_BENEATH]:
                out.append(finding_line(c.severity, c.code, _where(c), c.message, beneath=True))
            if len(b.beneath) > MAX_BENEATH:
                out.append(Text(more_consequences(len(b.beneath) - MAX_BENEATH), style="dim"))
            if live is not None and live_root == g.code:
                out.append(finding_line(live.severity, live.code, f"from step {live.step}", live.message, live=True, beneath=True))
                out.append(detail_line("live", LIVE_NOTE, "yellow"))
        if live is not None and live_root is None:
            line = finding_line(live.severity, live.code, f"from step {live.step}", live.message, live=True)
            out.append(line)
            entry = CATALOGUE.get(live.code)
            out.append(detail_line("live", LIVE_NOTE, "yellow"))
            out.append(detail_line("fix", live.fix or (entry.fix if entry else ""), "green"))
        shown = sum(1 + min(len(b.beneath), MAX_BENEATH) for b in drawn[:MAX_ROOTS])
        if len(groups) > shown:
            out.append(Text(more_codes(len(groups) - shown, "spectrace view --finding CODE or --json"), style="bold yellow"))
        return out


class StatusLine:
    """Fields packed into as few lines as the width allows; a field is never split."""

    SEP = "  "

    def __init__(self, fields: list[Text]) -> None:
        self.fields = fields

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        line = Text(no_wrap=True, overflow="ellipsis")
        for f in self.fields:
            if line.plain and line.cell_len + len(self.SEP) + f.cell_len > width:
                yield line
                line = Text(no_wrap=True, overflow="ellipsis")
            if line.plain:
                line.append(self.SEP)
            line.append_text(f)
        yield line

    @property
    def plain(self) -> str:
        return self.SEP.join(f.plain for f in self.fields)


class FollowFrame:
    """``top`` whole (cut only if it alone overflows), then ``rest`` cut to the height left,
    with one line saying how many lines did not fit."""

    def __init__(self, top: list[RenderableType], rest: list[RenderableType], *, height: int | None = None, hint: str = "") -> None:
        self.top = top
        self.rest = rest
        self.height = height
        self.hint = hint

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        height = self.height or options.height or console.height
        opts = options.update(height=None)
        top = [line for part in self.top for line in console.render_lines(part, opts, pad=False)]
        rest = [line for part in self.rest for line in console.render_lines(part, opts, pad=False)]
        lines = top + rest
        if len(lines) > height:
            keep = max(0, height - 1)
            cut = len(lines) - keep
            lines = lines[:keep]
            more = f"... {cut} more line{'s' if cut != 1 else ''} below; {self.hint}" if self.hint else f"... {cut} more lines below"
            lines.append(list(console.render_lines(Text(more, style="dim", no_wrap=True, overflow="ellipsis"), opts, pad=False)[0]))
        for line in lines:
            yield from line
            yield Segment.line()

    def text(self, console: Console) -> str:
        """The frame as plain lines (for a pipe and for tests)."""
        with console.capture() as cap:
            console.print(self)
        return cap.get()


def _where(g: FindingGroup) -> str:
    return when(g)


def _age(seconds: float) -> str:
    s = max(0, int(seconds))
    return f"{s}s ago" if s < 60 else f"{s // 60}m ago"


def _status_style(status: str) -> str:
    return "bold red" if status in ("bypassed", "missing", "disabled", "mismatch") else "bold"
