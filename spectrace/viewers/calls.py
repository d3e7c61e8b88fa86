"""``spectrace calls``: one call at a time, every tensor's shape, dtype and statistics.

Where ``spectrace view`` folds calls into a data path and a module table, this prints the
calls themselves, in the order each process made them: step, call index, module, role,
forward mode, and each argument and output. ``--jsonl`` and ``--json`` print the selected
call records exactly as the writer wrote them, for ``jq``.

The filters are ``view``'s (:class:`.model.ViewFilter`) plus a role glob;
:func:`selection_problem` says why nothing was selected, worded as ``view`` words it. The
command's arguments and exit status are ``cli/calls.py``'s.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from rich.text import Text

from spectrace.records import Call, TensorMeta
from spectrace.rules.globs import closest_names, did_you_mean, glob_match

from .loader import TraceFile, TraceSet
from .model import ViewFilter, _listed, build_view
from .render import dtype, plural, shape, stats_text

DEFAULT_LIMIT = 100  # calls printed as text unless --limit says otherwise (--jsonl/--json: all)
ARG_WIDTH = 22  # the argument column, before a longer name pushes the line
SHAPE_WIDTH = 16


@dataclass(frozen=True)
class SelectedCall:
    """One call and the process (file) that made it."""

    file: TraceFile
    call: Call


def role_matches(role: str | None, pattern: str) -> bool:
    """``--role``: the module-name glob dialect on the whole role (``draft.*``, ``target.layer[*]``)."""
    return role is not None and glob_match(role, pattern)


def select_calls(ts: TraceSet, flt: ViewFilter, role: str | None = None) -> list[SelectedCall]:
    """The calls ``flt`` and ``role`` keep, per process (file order), in call order."""
    out: list[SelectedCall] = []
    for f in ts.files:
        if flt.rank is not None and f.rank != flt.rank:
            continue
        for c in sorted(f.calls, key=lambda c: c.seq):
            if flt.step_ok(c.step) and flt.module_ok(c.module) and (role is None or role_matches(c.role, role)):
                out.append(SelectedCall(f, c))
    return out


def selection_problem(ts: TraceSet, flt: ViewFilter, role: str | None) -> str:
    """Why no call was selected, in one line: ``view``'s wording for the filter that matched
    nothing (rank, step, module), else the role's, else the filters together."""
    problem = build_view(ts, flt).filter_problem
    if problem:
        return problem
    files = [f for f in ts.files if flt.rank is None or f.rank == flt.rank]
    if role is not None and not any(role_matches(c.role, role) for f in files for c in f.calls):
        roles = sorted({c.role for f in files for c in f.calls if c.role})
        held = f"roles: {_listed(roles)}" if roles else "no call records a role"
        hint = did_you_mean(closest_names(role, roles))
        return f"--role {role!r} matches no call{'; ' + hint if hint else ''} ({held})"
    if not any(f.calls for f in files):
        return "the trace holds no call records"
    given = _given(flt, role)
    if len(given) == 1:  # view counts findings and captures too; no call is named by it
        return f"no call matches {given[0]} (it names findings or captures only)"
    return "no call matches " + " and ".join(given) + " together"


def _given(flt: ViewFilter, role: str | None) -> list[str]:
    given = []
    if flt.rank is not None:
        given.append(f"--rank {flt.rank}")
    if flt.step_min is not None or flt.step_max is not None:
        given.append(f"--step {flt.steps_text}")
    if flt.module:
        given.append(f"--module {flt.module!r}")
    if role is not None:
        given.append(f"--role {role!r}")
    return given


# ------------------------------------------------------------------------------ text
def call_lines(sel: SelectedCall, width: int = 80, *, show_process: bool = False, root: str = "") -> list[Text]:
    """The lines of one call: a heading, its context, then one line per tensor (two when
    the statistics would not fit ``width``). ``root``: the prefix every name shares, said
    once above (as ``view`` says it), left out here."""
    c = sel.call
    module = c.module.removeprefix(root)
    where = f"step {c.step}  call {c.seq}  " + (_process_tag(sel.file) + "  " if show_process else "")
    if len(where) + len(module) <= width:
        lines = [Text(where, style="bold")]
        lines[0].append(module, style="bold cyan")
    else:  # a long name gets a line of its own: whole wherever it can be
        lines = [Text(where.rstrip(), style="bold"), Text("  " + module, style="bold cyan")]
    context = _context(c)
    if len(lines[-1]) + 2 + len(c.module_type) <= width:
        lines[-1].append(f"  {c.module_type}", style="dim")
    else:
        context.insert(0, f"type {c.module_type}")
    lines = [_fit(line) for line in lines]
    for text in _wrapped(context, width - 2):
        lines.append(_fit(Text("  " + text, style="dim")))
    tensors = [("in", m) for m in c.inputs] + [("out", m) for m in c.outputs]
    if not tensors:
        lines.append(Text("  no tensors recorded", style="dim"))
    arg_w = min(ARG_WIDTH, max((len(m.arg) for _, m in tensors), default=0))
    shape_w = min(SHAPE_WIDTH, max((len(shape(m.shape)) for _, m in tensors), default=0))
    for side, m in tensors:
        lines += _tensor_lines(side, m, arg_w, shape_w, width)
    return lines


def shared_root(calls: Iterable[Call]) -> str:
    """``LlamaForCausalLM.`` when every call names the same model class as its root and its
    module starts with it (a plain model traced with ``SPECTRACE=1``), else ``""``: names
    then read as ``spectrace view`` shows them. An EAGLE-3 pair's ``draft.``/``target.``
    prefixes tell the models apart and stay.
    """
    root = None
    for c in calls:
        if not c.root or c.root in ("draft", "target") or not c.module.startswith(c.root + "."):
            return ""
        if root is None:
            root = c.root
        elif c.root != root:
            return ""
    return root + "." if root else ""


def _process_tag(f: TraceFile) -> str:
    if f.rank is not None:
        return f"rank {f.rank}"
    return f"pid {f.header.pid}" if f.header else f.name


def _wrapped(parts: list[str], width: int) -> list[str]:
    """Parts joined by two spaces, a new line where the next would pass ``width``."""
    lines: list[str] = []
    for part in parts:
        if lines and len(lines[-1]) + 2 + len(part) <= width:
            lines[-1] += "  " + part
        else:
            lines.append(part)
    return lines


def _context(c: Call) -> list[str]:
    parts = []
    if c.role:
        parts.append(f"role {c.role}")
    if c.forward_mode:
        parts.append(f"mode {c.forward_mode}")
    if c.tokens is not None:
        parts.append(f"tokens {c.tokens}")
    if c.draft_step is not None:
        parts.append(f"draft step {c.draft_step}")
    if c.graph_capture:
        parts.append("recorded during CUDA graph capture")
    if c.graph_replay:
        parts.append("CUDA graph replay" + (f" ({c.graph})" if c.graph else ""))
    return parts


def _tensor_lines(side: str, m: TensorMeta, arg_w: int, shape_w: int, width: int) -> list[Text]:
    if len(m.arg) > arg_w:
        # A name past the column gets a line of its own, so the columns below stay aligned.
        rest = _tensor_lines("", m.model_copy(update={"arg": ""}), arg_w, shape_w, width)
        return [_fit(Text(f"  {side:<3} {m.arg}")), *rest]
    left = f"  {side:<3} {m.arg:<{arg_w}} {shape(m.shape):<{shape_w}} {dtype(m.dtype):<4}"
    stats = stats_text(m.stats)
    style = "red" if m.stats is not None and (m.stats.nan or m.stats.inf) else ""
    if len(left) + 2 + len(stats) <= width:
        line = Text(left + "  ")
        line.append(stats, style=style)
        return [_fit(line)]
    return [_fit(Text(left.rstrip())), _fit(Text("        " + stats, style=style))]


def _fit(t: Text) -> Text:
    t.no_wrap = True
    t.overflow = "ellipsis"
    return t


def render_calls(selected: list[SelectedCall], limit: int | None, width: int = 80) -> Iterator[Text]:
    """The text of ``spectrace calls``: a count, the calls, and what ``limit`` left out."""
    processes = len({id(s.file) for s in selected})
    shown = selected if limit is None else selected[:limit]
    where = f" in {processes} processes" if processes > 1 else ""
    root = shared_root(s.call for s in selected)
    of = f" of {root[:-1]}" if root else ""
    yield Text(f"{plural(len(selected), 'call')}{of}{where}", style="bold")
    for sel in shown:
        yield Text("")
        yield from call_lines(sel, width, show_process=processes > 1, root=root)
    if len(shown) < len(selected):
        yield Text("")
        yield Text(f"{len(selected) - len(shown)} more calls not shown (--limit N shows N, --limit 0 all)", style="yellow")


# ------------------------------------------------------------------------------ raw records
def write_jsonl(selected: Iterable[SelectedCall]) -> None:
    """One call record per line, as written (the loader keeps unknown keys, so nothing is lost)."""
    write = sys.stdout.write
    for sel in selected:
        write(sel.call.model_dump_json() + "\n")


def write_json_array(selected: Iterable[SelectedCall]) -> None:
    """The same records as one JSON array, streamed (a large trace is never held as text)."""
    write = sys.stdout.write
    first = True
    write("[")
    for sel in selected:
        write(("\n" if first else ",\n") + sel.call.model_dump_json())
        first = False
    write("\n]\n")
