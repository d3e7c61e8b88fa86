"""Data-path assertions over a trace: shapes, dtypes, statistics, calls and findings.

A failed assertion raises an :class:`AssertionError` subclass whose message fits a
screen: the mismatch first (the first few broken places), then the root-cause findings
with their fix, which modules ran, and where the rest is. The whole call list, one line
per recorded call, is the exception's ``data_path`` (and ``Trace.data_path()``); every
broken place is its ``problems``, every finding its ``findings``. A module name that
matches nothing traced gets the closest traced names. Shapes accept ``...`` (any number
of dims) and ``None`` (one dim of any size).

    >>> import spectrace
    >>> with spectrace.trace({"target": target, "draft": draft}) as t:
    ...     draft(ids, target(ids).hidden_states)
    >>> t.assert_shape("draft.model.fc", input=(..., 3 * 64), output=(..., 64))

Works outside pytest too; the pytest plugin (:mod:`spectrace.pytest_plugin`) only adds
the ``spectrace`` fixture, command-line options and teardown checks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from .hooks.selection import glob_match
from .present.findings import cut as _cut
from .present.findings import record_lines, root_cause_lines
from .records import SEVERITY_RANK, Call, Finding, TensorMeta
from .rules.globs import closest_names as _closest_names

if TYPE_CHECKING:  # the Trace's methods call these functions: api imports this module, not the reverse
    from .api import Trace

ShapePattern = Sequence[Any]  # ints, None (one dim, any size) and at most one ... (any dims)
DEFAULT_PATH_LINES = 30
MAX_TENSORS_SHOWN = 4
# A failing test's message: mismatch first, short enough to read in pytest's output.
MAX_PROBLEMS_SHOWN = 3
MAX_FINDING_LINES = 4
MESSAGE_WIDTH = 118
DATA_PATH_HINT = "Every call that ran: err.data_path, or t.data_path()."
EXPECTED_ATTR = "_spectrace_expected"  # ids of findings a test asserted on purpose


# ----------------------------------------------------------------------------- errors


class SpectraceAssertionError(AssertionError):
    """A data-path contract did not hold.

    The message is short (the mismatch, the root causes, what ran); the rest is kept on
    the exception: ``data_path`` (the observed call list, one line per call), ``problems``
    (every broken place) and ``findings`` (every finding of the trace).
    """

    def __init__(self, message: str, *, data_path: str = "", problems: Sequence[str] = (), findings: Sequence[Finding] = ()) -> None:
        super().__init__(message)
        self.data_path = data_path
        self.problems = list(problems)
        self.findings = list(findings)


class CallContractError(SpectraceAssertionError):
    """A module was (not) called against the contract, or is not traced at all."""


class ShapeContractError(SpectraceAssertionError):
    pass


class DtypeContractError(SpectraceAssertionError):
    pass


class StatsContractError(SpectraceAssertionError):
    pass


class FindingError(SpectraceAssertionError):
    """Findings were present that should not be, or one that should be was not."""


# ----------------------------------------------------------------------------- shapes


def shape_matches(observed: Sequence[int], pattern: ShapePattern) -> bool:
    """Whether ``observed`` fits ``pattern``; ``...`` stands for any dims, ``None`` for one.

    >>> shape_matches([1, 8, 192], (..., 3 * 64))
    True
    """
    pattern = list(pattern)
    observed = list(observed)
    ellipses = [i for i, d in enumerate(pattern) if d is Ellipsis]
    if len(ellipses) > 1:
        raise ValueError(f"a shape pattern takes at most one '...': {format_pattern(pattern)}")

    def fits(dims: list[int], pats: list[Any]) -> bool:
        return len(dims) == len(pats) and all(p is None or int(p) == d for d, p in zip(dims, pats))

    if not ellipses:
        return fits(observed, pattern)
    cut = ellipses[0]
    head, tail = pattern[:cut], pattern[cut + 1 :]
    if len(observed) < len(head) + len(tail):
        return False
    return fits(observed[: len(head)], head) and fits(observed[len(observed) - len(tail) :], tail)


def format_pattern(pattern: ShapePattern) -> str:
    parts = ["..." if d is Ellipsis else "*" if d is None else str(int(d)) for d in pattern]
    return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"


def format_shape(shape: Sequence[int]) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def _dtype_name(dtype: Any) -> str:
    # Accepts torch.float32, "float32" or "torch.float32" without importing torch here.
    return str(dtype).replace("torch.", "")


# ----------------------------------------------------------------------------- rendering


def format_meta(meta: TensorMeta, with_arg: bool = False) -> str:
    text = f"{format_shape(meta.shape)} {meta.dtype}"
    return f"{meta.arg}={text}" if with_arg else text


def _side(metas: list[TensorMeta]) -> str:
    if not metas:
        return "-"
    shown = [format_meta(m, with_arg=len(metas) > 1) for m in metas[:MAX_TENSORS_SHOWN]]
    if len(metas) > MAX_TENSORS_SHOWN:
        shown.append(f"+{len(metas) - MAX_TENSORS_SHOWN} more")
    return ", ".join(shown)


def describe_call(call: Call, name_width: int = 0, marked: bool = False, type_width: int = 0) -> str:
    """One line: ``step 0  #3  draft.model.fc  Linear  (7, 192) float32 -> (7, 64) float32``."""
    mark = ">" if marked else " "
    return (
        f"{mark} step {call.step:<3} #{call.seq:<4} {call.module:<{name_width}}  {call.module_type:<{type_width}}  "
        f"{_side(call.inputs)} -> {_side(call.outputs)}"
    )


def _matches(name: str, pattern: str) -> bool:
    return name == pattern or glob_match(name, pattern)


def data_path(trace: Trace, focus: Iterable[str] = (), limit: int = DEFAULT_PATH_LINES) -> str:
    """The observed call list, at most ``limit`` lines; calls of ``focus`` globs are marked ``>``.

    When there are more calls than fit, the focused calls and their neighbours are kept
    first, then the earliest calls; gaps are shown as ``...``.
    """
    calls = trace.calls()
    focus = [f for f in focus if f]
    if not calls:
        hooked = ", ".join(trace.hooked[:12]) + (" ..." if len(trace.hooked) > 12 else "")
        return f"Observed data path: no call was recorded (hooked modules: {hooked or 'none'})."
    marked = {i for i, c in enumerate(calls) if any(_matches(c.module, f) for f in focus)}
    keep: set[int] = set(range(len(calls))) if len(calls) <= limit else set()
    for i in sorted(marked):
        if len(keep) >= limit:
            break
        keep.update(j for j in (i - 1, i, i + 1) if 0 <= j < len(calls))
    i = 0
    while len(keep) < min(limit, len(calls)):
        keep.add(i)
        i += 1
    shown = sorted(keep)[:limit] if len(calls) > limit else sorted(keep)
    width = max(len(calls[i].module) for i in shown)
    type_width = max(len(calls[i].module_type) for i in shown)
    steps = sorted({c.step for c in calls})
    head = f"Observed data path: {len(calls)} calls in {len(steps)} step{'s' if len(steps) != 1 else ''}"
    head += " ('>' marks the modules asserted on):" if focus else ":"
    lines = [head]
    previous = -1
    for i in shown:
        if i != previous + 1:
            lines.append(f"    ... {i - previous - 1} calls not shown")
        lines.append("  " + describe_call(calls[i], width, i in marked, type_width))
        previous = i
    if previous < len(calls) - 1:
        lines.append(f"    ... {len(calls) - 1 - previous} more calls not shown (trace.calls() has all of them)")
    return "\n".join(lines)


def format_findings(findings: Sequence[Finding]) -> str:
    """Every finding, two lines each (the long form): what was seen where, then the fix."""
    return "\n".join(record_lines(findings))


def format_root_causes(findings: Sequence[Finding], width: int = 116) -> str:
    """Findings as a failing test should show them: each root cause with its module, what
    was seen and its one fix; what follows from it in one line beneath (the order and the
    judgement are ``spectrace view``'s: :func:`spectrace.checks.root_causes.root_causes`)."""
    return "\n".join(root_cause_lines(findings, width))


def explain(trace: Trace, headline: str, focus: Iterable[str] = (), limit: int = DEFAULT_PATH_LINES) -> str:
    """``headline`` followed by the observed data path and the findings (the long form)."""
    return "\n".join([headline, data_path(trace, focus, limit), format_findings(trace.findings)])


def called_summary(trace: Trace, width: int = MESSAGE_WIDTH) -> str:
    """One line: the modules that ran, in first-call order, each with its call count."""
    counts: dict[str, int] = {}
    for c in trace.calls():
        counts[c.module] = counts.get(c.module, 0) + 1
    if not counts:
        return "Called: nothing (no call was recorded)."
    return _cut("Called: " + ", ".join(f"{name} ×{n}" for name, n in counts.items()), width)


def short_message(trace: Trace, headline: str, problems: Sequence[str] = (), notes: Sequence[str] = ()) -> str:
    """A failing assertion's message: ``headline``, the first broken places, the notes,
    the root-cause findings with their fix, what ran, and where the whole call list is."""
    lines = [_cut(headline, MESSAGE_WIDTH)]
    lines += [_cut(f"  {p}", MESSAGE_WIDTH) for p in problems[:MAX_PROBLEMS_SHOWN]]
    if len(problems) > MAX_PROBLEMS_SHOWN:
        lines.append(f"  ... {len(problems) - MAX_PROBLEMS_SHOWN} more (err.problems has all {len(problems)})")
    lines += [_cut(n, MESSAGE_WIDTH) for n in notes]
    findings = trace.findings
    if not findings:
        lines.append("Findings: none.")
    else:
        causes = format_root_causes(findings, MESSAGE_WIDTH).splitlines()
        lines += causes[:MAX_FINDING_LINES]
        if len(causes) > MAX_FINDING_LINES:
            lines.append(f"  ... more: err.findings has all {len(findings)} findings; spectrace view shows them")
    lines += [called_summary(trace), DATA_PATH_HINT]
    return "\n".join(lines)


def _fail(
    error: type[SpectraceAssertionError],
    trace: Trace,
    headline: str,
    focus: Iterable[str] = (),
    problems: Sequence[str] = (),
    notes: Sequence[str] = (),
) -> SpectraceAssertionError:
    """The exception to raise: the short message, the call list and the rest kept on it."""
    return error(
        short_message(trace, headline, problems, notes),
        data_path=data_path(trace, focus),
        problems=problems,
        findings=trace.findings,
    )


# ----------------------------------------------------------------------------- selection


def traced_names(trace: Trace, module: str) -> list[str]:
    """Hooked (or called) module names that ``module`` names: exact or glob."""
    names = dict.fromkeys([*trace.hooked, *trace.modules()])
    return [n for n in names if _matches(n, module)]


def closest_names(trace: Trace, module: str, n: int = 3) -> list[str]:
    """Traced module names closest to ``module`` (a typo, a missing prefix), best first;
    a glob is compared by its last part (``**.fcc`` finds ``draft.model.fc``)."""
    return _closest_names(module, list(dict.fromkeys([*trace.hooked, *trace.modules()])), n)


def _untraced_notes(trace: Trace, module: str) -> list[str]:
    close = closest_names(trace, module)
    if close:
        return [f"Did you mean {' or '.join(close)}?"]
    names = list(dict.fromkeys([*trace.hooked, *trace.modules()]))
    shown = ", ".join(names[:8]) + (f" ... ({len(names)} in all)" if len(names) > 8 else "")
    return [
        f"Traced: {shown or 'nothing'}.",
        f"Trace it: spectrace.trace(..., modules=[{module!r}, ...]) or profile='eagle3'/'all'.",
    ]


def calls_of(trace: Trace, module: str, *, required: bool = True) -> list[Call]:
    """Calls of ``module``; raises when it is not traced, or (``required``) never called."""
    __tracebackhide__ = True
    if not traced_names(trace, module):
        headline = f"{module!r} matches no traced module, so spectrace cannot say whether it ran."
        raise _fail(CallContractError, trace, headline, notes=_untraced_notes(trace, module))
    calls = trace.calls(module)
    if required and not calls:
        raise _fail(CallContractError, trace, _never_called(trace, module), [module])
    return calls


def _never_called(trace: Trace, module: str) -> str:
    names = traced_names(trace, module)
    return f"{module!r} was never called (it is traced, as {', '.join(names)})."


def _select(calls: list[Call], call: int | None) -> list[Call]:
    if call is None:
        return calls
    try:
        return [calls[call]]
    except IndexError:
        raise CallContractError(f"call={call} but only {len(calls)} calls were recorded") from None


def _label(meta: TensorMeta, arg: str | None, side: str) -> str:
    return meta.arg if arg else f"{meta.arg} (first {side})"


def _pick(metas: list[TensorMeta], arg: str | None) -> TensorMeta | None:
    """The first tensor of a side, or the one whose ``arg`` name matches (``input[2]``, ``kwarg.hidden_states``)."""
    if arg is None:
        return metas[0] if metas else None
    for meta in metas:
        if meta.arg == arg or glob_match(meta.arg, arg):
            return meta
    return None


# ----------------------------------------------------------------------------- assertions


def assert_called(trace: Trace, module: str, times: int | None = None) -> list[Call]:
    """``module`` (exact or glob) ran at least once (exactly ``times`` if given); returns its calls."""
    __tracebackhide__ = True
    calls = calls_of(trace, module)
    if times is not None and len(calls) != times:
        raise _fail(CallContractError, trace, f"{module!r} was called {len(calls)} times, expected {times}.", [module])
    return calls


def assert_not_called(trace: Trace, module: str) -> None:
    """``module`` is traced and never ran."""
    __tracebackhide__ = True
    calls = calls_of(trace, module, required=False)
    if calls:
        where = ", ".join(f"step {c.step} #{c.seq}" for c in calls[:8])
        more = " ..." if len(calls) > 8 else ""
        headline = f"{module!r} was expected not to run but was called {len(calls)} times ({where}{more})."
        raise _fail(CallContractError, trace, headline, [module])


def _contract_problems(
    calls: list[Call],
    input: Any,
    output: Any,
    input_arg: str | None,
    output_arg: str | None,
    broken: Callable[[Any, Any], str | None],
) -> list[str]:
    """One line per call side whose chosen tensor is absent or ``broken`` (shape or dtype)."""
    problems: list[str] = []
    for c in calls:
        for side, want, arg, metas in (("input", input, input_arg, c.inputs), ("output", output, output_arg, c.outputs)):
            if want is None:
                continue
            meta = _pick(metas, arg)
            if meta is None:
                problems.append(f"{c.module} (step {c.step} #{c.seq}) has no {arg or f'first {side}'} tensor; it had: {_side(metas)}")
                continue
            why = broken(meta, want)
            if why is not None:
                problems.append(f"{c.module} (step {c.step} #{c.seq}) {_label(meta, arg, side)} is {why}")
    return problems


def assert_shape(
    trace: Trace,
    module: str,
    input: ShapePattern | None = None,
    output: ShapePattern | None = None,
    *,
    input_arg: str | None = None,
    output_arg: str | None = None,
    call: int | None = None,
) -> list[Call]:
    """Every call of ``module`` (or only index ``call``) takes/returns tensors of these shapes.

    ``input``/``output`` check the first tensor input/output, or the one named by
    ``input_arg``/``output_arg`` (``"input[2]"``, ``"kwarg.hidden_states"``, ``"output[0]"``).
    """
    __tracebackhide__ = True
    if input is None and output is None:
        raise ValueError("assert_shape needs input=, output= or both")
    calls = _select(calls_of(trace, module), call)

    def broken(meta: Any, pattern: Any) -> str | None:
        if shape_matches(meta.shape, pattern):
            return None
        return f"{format_shape(meta.shape)}, expected {format_pattern(pattern)}"

    _enforce(trace, module, "shape", ShapeContractError, _contract_problems(calls, input, output, input_arg, output_arg, broken))
    return calls


def _enforce(trace: Trace, module: str, what: str, error: type[SpectraceAssertionError], problems: list[str]) -> None:
    """Raise ``error`` naming the first broken places of a shape or dtype contract."""
    __tracebackhide__ = True
    if problems:
        head = f"{what} contract of {module!r} broken in {len(problems)} place{'s' if len(problems) > 1 else ''}:"
        raise _fail(error, trace, head, [module], problems)


def assert_dtype(
    trace: Trace,
    module: str,
    input: Any = None,
    output: Any = None,
    *,
    input_arg: str | None = None,
    output_arg: str | None = None,
    call: int | None = None,
) -> list[Call]:
    """Like :func:`assert_shape` for dtypes (``torch.bfloat16`` or ``"bfloat16"``)."""
    __tracebackhide__ = True
    if input is None and output is None:
        raise ValueError("assert_dtype needs input=, output= or both")
    calls = _select(calls_of(trace, module), call)

    def broken(meta: Any, want: Any) -> str | None:
        return None if meta.dtype == _dtype_name(want) else f"{meta.dtype}, expected {_dtype_name(want)}"

    _enforce(trace, module, "dtype", DtypeContractError, _contract_problems(calls, input, output, input_arg, output_arg, broken))
    return calls


def assert_stats(
    trace: Trace,
    module: str,
    *,
    finite: bool | None = True,
    absmax: float | tuple[float, float] | None = None,
    side: str = "output",
    call: int | None = None,
) -> list[Call]:
    """Recorded statistics of ``module``'s tensors on ``side`` ("output", "input" or "both").

    ``finite=True``: no NaN/Inf; ``absmax=x``: every tensor's max |value| <= x;
    ``absmax=(lo, hi)``: within [lo, hi] (a layer feeding the wrong scale shows here).
    Needs statistics (``stats="basic"``, the default); integer/bool tensors are skipped.
    """
    __tracebackhide__ = True
    if side not in ("output", "input", "both"):
        raise ValueError(f"side must be 'output', 'input' or 'both', not {side!r}")
    low, high = (None, absmax) if absmax is None or isinstance(absmax, (int, float)) else absmax
    calls = _select(calls_of(trace, module), call)
    problems: list[str] = []
    checked = 0
    for c in calls:
        metas = (c.inputs if side != "output" else []) + (c.outputs if side != "input" else [])
        for meta in metas:
            s = meta.stats
            if s is None or not _is_float(meta.dtype):
                continue
            checked += 1
            where = f"{c.module} (step {c.step} #{c.seq}) {meta.arg} {format_shape(meta.shape)} {meta.dtype}"
            if finite and ((s.nan or 0) > 0 or (s.inf or 0) > 0):
                problems.append(f"{where} holds {s.nan or 0} NaN and {s.inf or 0} Inf of {s.numel} values")
            if s.absmax is not None and ((high is not None and s.absmax > high) or (low is not None and s.absmax < low)):
                bound = f"<= {high}" if low is None else f"in [{low}, {high}]"
                problems.append(f"{where} has absmax {s.absmax:.6g}, expected {bound}")
    if not checked:
        headline = f"no statistics were recorded for {module!r} ({side}); trace with stats='basic' (the default)."
        raise _fail(StatsContractError, trace, headline, [module])
    if problems:
        head = f"statistics contract of {module!r} broken in {len(problems)} place{'s' if len(problems) > 1 else ''}:"
        raise _fail(StatsContractError, trace, head, [module], problems)
    return calls


def _is_float(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat", "complex"))


def _at_least(severity: str) -> list[str]:
    if severity not in SEVERITY_RANK:
        raise ValueError(f"severity must be one of {', '.join(SEVERITY_RANK)}, not {severity!r}")
    return [s for s, rank in SEVERITY_RANK.items() if rank <= SEVERITY_RANK[severity]]


def expected_ids(trace: Trace) -> set[int]:
    """Ids of findings a test asserted on purpose (they do not fail ``--spectrace``)."""
    return trace.__dict__.setdefault(EXPECTED_ATTR, set())


def unexpected_findings(trace: Trace, severity: str = "error") -> list[Finding]:
    """Findings at ``severity`` or worse that no :func:`assert_finding` claimed."""
    wanted = _at_least(severity)
    claimed = expected_ids(trace)
    return [f for f in trace.findings if f.severity in wanted and id(f) not in claimed]


def assert_no_findings(trace: Trace, severity: str = "error") -> None:
    """No finding at ``severity`` or worse ("error" < "warning" < "info"), except claimed ones."""
    __tracebackhide__ = True
    found = unexpected_findings(trace, severity)
    if found:
        codes = ", ".join(sorted({f.code for f in found}))
        raise FindingError(
            f"{len(found)} unexpected finding{'s' if len(found) > 1 else ''} of severity {severity} or worse: {codes}\n"
            + format_root_causes(found)
            + "\n(t.data_path() shows what ran; spectrace view shows the trace file)"
        )


def assert_finding(trace: Trace, code: str, *, module: str | None = None) -> Finding:
    """A finding with ``code`` (and at ``module``, exact or glob) is present; returns the first.

    Every finding with that code is then *claimed*: ``--spectrace`` no longer fails the test on it.
    """
    __tracebackhide__ = True
    found = [f for f in trace.findings if f.code == code and (module is None or (f.module and _matches(f.module, module)))]
    if not found:
        where = f" at {module!r}" if module else ""
        raise _fail(FindingError, trace, f"expected a finding {code!r}{where}, but none was recorded.", [module or ""])
    expected_ids(trace).update(id(f) for f in found)
    return found[0]
