"""One replay: the served draft's kept inputs through a reference built from its checkpoint.

:func:`replay` checks that the trace and the checkpoint belong together, compares module
by module, and keeps the result beside the trace; :func:`render` is its text. The
command's arguments and exit status are ``cli/replay.py``'s.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..audit.checkpoint import AuditInputError
from .file import MAX_BYTES, REPLAY_SUFFIX, RESULT_SUFFIX, ReplayFileError, find_replay_files, read_replay, save_beside
from .reference import Reference, ReferenceError
from .trainer_model import TrainerReference, installed
from .trainer_specforge import SpecForgeReference
from .trainer_speculators import SpeculatorsReference, is_speculators_checkpoint
from .weights import load_draft

if TYPE_CHECKING:
    from .compare import ReplayResult

HOW_TO_KEEP = "run the server with SPECTRACE=1 SPECTRACE_REPLAY=1 SPECTRACE_DIR=<folder> to keep them"
TRAINERS: dict[str, type[TrainerReference]] = {"speculators": SpeculatorsReference, "specforge": SpecForgeReference}
REFERENCES = ("auto", "speculators", "specforge", "builtin")
HIDDEN_KEYS = ("fc_out", "embeds", "layer_in", "layer_out", "norm_out")  # rows of the draft's hidden size


class ReplayInputError(Exception):
    """The trace, the checkpoint or the reference asked for cannot be replayed: one line."""


def replay(trace: str, draft: str, reference: str = "auto", warn: Callable[[str], None] | None = None) -> ReplayResult:
    """Replay the last kept inputs of ``trace`` through ``draft``; the result is also written
    beside the trace (a failure to write it goes to ``warn``, it is not fatal)."""
    if not os.path.exists(trace):
        raise ReplayInputError(f"{trace}: no such file or folder")
    if reference in TRAINERS and not installed(reference):
        raise ReplayInputError(f"--reference {reference}: the package is not installed (pip install spectrace[{reference}])")
    files = find_replay_files(trace)
    if not files:
        raise ReplayInputError(f"{trace}: no kept draft inputs ({REPLAY_SUFFIX}); {HOW_TO_KEEP}")
    try:
        meta, forwards = read_replay(files[-1])
        ckpt, raw, tensors = load_draft(Path(draft))
        ref = _reference(reference, Reference.build(ckpt, raw, tensors), raw, tensors)
    except (ReplayFileError, AuditInputError, ReferenceError) as exc:
        raise ReplayInputError(str(exc)) from None
    if not forwards and meta.too_large:
        raise ReplayInputError(
            f"{files[-1]}: no kept forwards: {len(meta.too_large)} forward(s) of {max(meta.too_large) / (1 << 20):.1f} MiB "
            f"passed the {MAX_BYTES >> 20} MiB cap; serve with fewer SPECTRACE_REPLAY_ROWS (this file kept {meta.rows})"
        )
    if not forwards:
        raise ReplayInputError(f"{files[-1]}: no kept forwards; {HOW_TO_KEEP}")
    fc = ref.w.get("fc.weight")
    width = next((f.tensors["hidden_in"].shape[-1] for f in forwards if "hidden_in" in f.tensors), None)
    # The reader checked that the hidden states share one width: it must be the checkpoint's.
    hidden = next((t.shape[-1] for f in forwards for k, t in f.tensors.items() if k in HIDDEN_KEYS), None)
    if hidden is not None and hidden != ref.hidden:
        raise ReplayInputError(f"the checkpoint's hidden size is {ref.hidden}, the trace's draft ran {hidden}: not this trace's draft")
    fc_in = next((f.tensors["fc_in"].shape[-1] for f in forwards if "fc_in" in f.tensors), None)
    if fc is not None and fc_in not in (None, fc.shape[1]):
        raise ReplayInputError(f"the checkpoint's fc reads {fc.shape[1]} wide, the trace's fc read {fc_in}: not this trace's draft")
    if fc is not None and width not in (None, fc.shape[1], ref.hidden):
        raise ReplayInputError(f"the checkpoint's fc reads {fc.shape[1]} wide, the trace's fused input is {width}: not this trace's draft")
    from .compare import compare

    result = compare(ref, forwards, meta.dtype)
    if not any(check.compared for check in result.modules):
        missing = "; ".join(f"{c.module}: {c.note}" for c in result.modules if c.note)
        raise ReplayInputError(f"{files[-1]}: nothing was compared, no module's served output and inputs were both kept ({missing})")
    result.trace, result.replay_file, result.draft, result.engine = meta.trace, os.path.basename(files[-1]), str(draft), meta.engine
    result.reference = ref.TRAINER if isinstance(ref, TrainerReference) else "builtin"
    if reference == "auto" and result.reference == "builtin":
        why = "speculators is not installed" if is_speculators_checkpoint(raw) else "not a speculators-format checkpoint"
        result.notes.append(
            f"reference: spectrace's built-in EAGLE-3 draft ({why}; the trainers' own modelling code is not used: "
            "--reference specforge runs SpecForge's for its format)"
        )
    save_beside(files[-1], RESULT_SUFFIX, result, warn)
    return result


def _reference(asked: str, builtin: Reference, raw: dict[str, Any], tensors: dict[str, Any]) -> Reference:
    """The reference ``asked`` for. ``auto`` takes speculators' own model for a
    speculators-format checkpoint when the package is installed, else the built-in one: a
    flat config is SpecForge's format but also the original EAGLE's and the engines', so
    SpecForge's model runs only when asked for."""
    if asked in TRAINERS:
        return TRAINERS[asked].wrap(builtin, raw, tensors)
    if asked == "auto" and is_speculators_checkpoint(raw) and installed("speculators"):
        return SpeculatorsReference.wrap(builtin, raw, tensors)
    return builtin


def render(result: ReplayResult) -> str:
    """The text of a replay: each module's verdict, then the first divergence and its causes."""
    lines = [
        f"replay: {result.forwards} forward(s), {result.rows} row(s), {result.dtype or 'unknown dtype'}, "
        f"draft {result.draft}, reference {result.reference}"
    ]
    for check in result.modules:
        if not check.compared:
            state = f"not compared ({check.note})" if check.note else "not compared"
        else:
            err = f"max error {check.max_error:.3g} (tolerance {check.tolerance:.3g})" if check.max_error is not None else check.note
            if check.max_error is not None and check.note:
                err += f"; {check.note}"
            state = ("agrees" if check.agrees else "DIVERGES") + f": {err}"
        lines.append(f"  {check.module:<15} {state}")
    if result.agree:
        lines.append("the served draft matches its checkpoint")
    else:
        lines.append(f"first divergence: {result.first_divergence}")
        lines.append(f"  served:    {result.served}")
        lines.append(f"  reference: {result.expected}")
        lines.append("  causes that fit:")
        lines += [f"    - {c}" for c in result.causes]
    lines += [f"note: {n}" for n in result.notes]
    return "\n".join(lines)
