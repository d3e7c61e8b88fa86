"""What every command that reads traces shares: the filters, loading, and its warnings.

``view``, ``calls``, ``export`` and ``diff`` take the same ``--module``/``--rank``/``--step``
filters, load the same way (with progress on a terminal), and say the same lines about
files that were partly or not at all readable.
"""

from __future__ import annotations

import argparse

from ..viewers.loader import TraceSet, load_traces, shown_path
from ..viewers.model import ViewFilter
from ..viewers.progress import load_progress
from .errors import UsageError, say


def step_range(text: str) -> tuple[int | None, int | None]:
    """``--step``: ``N`` or ``A:B`` (either end may be left open)."""
    try:
        if ":" in text:
            lo, hi = text.split(":", 1)
            return (int(lo) if lo.strip() else None, int(hi) if hi.strip() else None)
        n = int(text)
        return n, n
    except ValueError:
        raise argparse.ArgumentTypeError(f"--step wants N or A:B, got {text!r}") from None


def positive(text: str) -> int:
    """A whole number >= 1 (``--window``)."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"wants a whole number >= 1, got {text!r}")
    return n


def add_trace_filters(p: argparse.ArgumentParser, module_help: str = "only modules matching GLOB (full name or dotted suffix)") -> None:
    """The filters every trace reader takes: ``--module``, ``--rank``, ``--step``."""
    p.add_argument("--module", metavar="GLOB", help=module_help)
    p.add_argument("--rank", type=int, metavar="N", help="only the process of this rank")
    p.add_argument("--step", type=step_range, metavar="N|A:B", help="only these steps (A: or :B leave one end open)")


def trace_filter(args: argparse.Namespace, **more: object) -> ViewFilter:
    """The :class:`ViewFilter` of the parsed ``--module``/``--rank``/``--step`` (and ``more``)."""
    lo, hi = args.step if args.step else (None, None)
    return ViewFilter(module=args.module, rank=args.rank, step_min=lo, step_max=hi, **more)  # type: ignore[arg-type]


def nothing_readable(ts: TraceSet) -> str:
    """Why nothing of ``ts`` could be read, in one line."""
    problems = ts.problems
    if problems:
        first = problems[0].message
        return first if len(problems) == 1 else f"{first} (and {len(problems) - 1} more problems)"
    return f"{shown_path(ts.source)}: no readable records"


def warn_problems(prog: str, ts: TraceSet) -> None:
    """One warning line per problem of a partly readable trace."""
    for problem in ts.problems:
        say(f"{prog}: warning: {problem.message}")


def load(prog: str, path: str, label: str = "") -> TraceSet:
    """Load ``path`` (progress on a terminal's stderr), say its problems; :class:`UsageError`
    when nothing is readable (``label``: which of several traces, ``A`` or ``B``)."""
    with load_progress(f"reading {shown_path(path)}") as progress:
        ts = load_traces(path, progress=progress)
    if not ts.readable:
        raise UsageError(f"{label}: {nothing_readable(ts)}" if label else nothing_readable(ts))
    warn_problems(prog, ts)
    return ts
