"""One probe: the served draft's top-1 agreement with its target, as served and under each variant.

:func:`probe` reads the latest replay file of a trace that holds the target's choices, the
draft checkpoint, builds the variants (:mod:`.variants`), judges them on the rows
:mod:`.rows` picks, and keeps the result beside the trace (``<stem>.probe.json``, which
``spectrace view`` reads through :mod:`spectrace.checks.probe`). :func:`render` is its text.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, Field

from ..audit.checkpoint import AuditInputError
from ..replay.file import REPLAY_SUFFIX, ReplayData, ReplayFileError, ReplayMeta, find_replay_files, read_replay, save_beside
from ..replay.reference import Reference, ReferenceError
from ..replay.weights import load_draft
from ..rules.acceptance import chain_accept_length, mean_accept_length, wilson
from .rows import ProbeRows, select_rows
from .variants import TARGETS_OWN, TargetFacts, Variant, predict, variants

PROBE_SUFFIX = ".probe.json"  # beside the trace; spectrace.checks.probe reads it
HOW_TO_KEEP = "run the server with SPECTRACE=1 SPECTRACE_REPLAY=1 SPECTRACE_DIR=<folder> to keep them"
DEFAULT_STEPS = 3  # SGLang's and vLLM's usual speculative_num_steps / num_speculative_tokens
MAX_TRACE_BYTES = 256 * 1024 * 1024  # the trace is read for its accept lengths; a larger one is not


class ProbeInputError(Exception):
    """The trace or the checkpoint cannot be probed: one line."""


class VariantResult(BaseModel):
    name: str
    axis: str = Field(
        description="what the variant changes: served, config, rope, norm_before_residual, embed, vocabulary map, capture, head"
    )
    hits: int = Field(description="rows whose top-1 target id is the target's own choice")
    rows: int
    agreement: float
    low: float = Field(description="Wilson 95 % interval, lower end")
    high: float
    chain: float = Field(description="estimated accept length: 1 + a + a^2 + ... + a^k, a = agreement, k = steps")
    fix: str = ""


class ProbeResult(BaseModel):
    """What ``spectrace probe`` concluded; written beside the trace as ``<stem>.probe.json``."""

    format: str = "spectrace.probe-result/1"
    trace: str = ""
    replay_file: str = ""
    draft: str = ""
    engine: str = ""
    rows_used: str = Field("", description="which rows were judged: target-written ones, or every paired row")
    rows: int = 0
    paired_rows: int = 0
    written_rows: int = 0
    steps: int = DEFAULT_STEPS
    steps_from: str = ""
    live_accept_length: float | None = Field(None, description="the trace's own mean accept length (greedy steps), when it has one")
    served_wins: bool = True
    winner: str = "as served"
    decided: list[str] = Field(default=[], description="the axes the probe measured (rope, norm_before_residual, ...)")
    variants: list[VariantResult] = []
    notes: list[str] = []


def probe(
    trace: str, draft: str, steps: int | None = None, warn: Callable[[str], None] | None = None, target: str | None = None
) -> ProbeResult:
    """Probe the latest replay file of ``trace`` that holds the target's choices against ``draft``
    (``target``: the target's folder, for the capture-id readings and the target's head)."""
    if not os.path.exists(trace):
        raise ProbeInputError(f"{trace}: no such file or folder")
    files = find_replay_files(trace)
    if not files:
        raise ProbeInputError(f"{trace}: no kept draft inputs ({REPLAY_SUFFIX}); {HOW_TO_KEEP}")
    try:
        chosen = _latest_with_target(files)
        ckpt, raw, tensors = load_draft(Path(draft))
        ref = Reference.build(ckpt, raw, tensors)
    except (ReplayFileError, AuditInputError, ReferenceError) as exc:
        raise ProbeInputError(str(exc)) from None
    if chosen is None:
        raise ProbeInputError(
            f"{trace}: the kept draft inputs hold no target choices (target_in, target_next): the target's forward was "
            f"not seen beside the draft's; {HOW_TO_KEEP} (a spectrace that keeps them)"
        )
    path, meta, forwards = chosen
    _fits(ref, forwards)
    rows = select_rows(forwards)
    if not rows.forwards:
        raise ProbeInputError(
            f"{os.path.basename(path)}: no kept forward pairs with its target's choices ({rows.unpaired} unpaired): "
            "the target rows kept are not the ones the draft read"
        )
    facts = _target_facts(Path(target), rows, raw, meta.engine) if target is not None else None
    k, k_from, live = _steps(path, meta, steps)
    result = ProbeResult(
        trace=meta.trace,
        replay_file=os.path.basename(path),
        draft=str(draft),
        engine=meta.engine,
        rows_used=rows.which,
        paired_rows=rows.paired_rows,
        written_rows=rows.written_rows,
        steps=k,
        steps_from=k_from,
        live_accept_length=live,
        notes=list(ref.notes),
    )
    has_embed = ref.embed(torch.zeros(1, dtype=torch.long)) is not None and any("embeds" in f.tensors for f, _, _ in rows.forwards)
    for variant in variants(ref, ckpt.maps.t2d, meta.target_rotary, has_embed, facts):
        measured = _measure(variant, rows, k)
        if measured is not None:
            result.variants.append(measured)
    _decide(result)
    if rows.unpaired:
        result.notes.append(f"{rows.unpaired} kept forward(s) not paired with their target's choices were left out")
    if meta.target_rotary is None:
        result.notes.append("the target's rotary was not kept: rope bases tried are the common ones, not the target's own")
    save_beside(path, PROBE_SUFFIX, result, warn)
    return result


MIN_SAME_CHOICE = 0.9  # the recomputed target must choose as the served one did on this share of rows


def _target_facts(folder: Path, rows: ProbeRows, raw: dict[str, Any], engine: str) -> TargetFacts:
    """Recompute the target's boundaries at every judged forward's rows (into its tensors as
    ``target_states``), after checking that this target chooses as the served one did."""
    from .target import TargetModelError, head_weight, load_target, target_rows

    try:
        model = load_target(folder)
    except TargetModelError as exc:
        raise ProbeInputError(str(exc)) from None
    same = total = 0
    layers = 0
    for fwd, _picked, _label in rows.forwards:
        states, top1 = target_rows(model, fwd.tensors["target_in"])
        fwd.tensors["target_states"] = states
        layers = int(states.shape[0])
        chosen = fwd.tensors["target_next"].long()
        same += int((top1 == chosen).sum())
        total += int(chosen.numel())
    if total and same / total < MIN_SAME_CHOICE:
        raise ProbeInputError(
            f"--target {folder}: it chooses the served target's next token on {same} of {total} kept rows: not the served target"
        )
    nested = raw.get("eagle_config")
    found = (nested if isinstance(nested, dict) else raw).get("eagle_aux_hidden_state_layer_ids")
    ids = [int(i) for i in found] if isinstance(found, list) and all(isinstance(i, int) for i in found) else None
    return TargetFacts(boundaries=layers, ids=ids, engine=engine, head=head_weight(model))


def _latest_with_target(files: list[str]) -> tuple[str, ReplayMeta, list[ReplayData]] | None:
    for path in reversed(files):
        meta, forwards = read_replay(path)
        if any("target_next" in f.tensors for f in forwards):
            return path, meta, forwards
    return None


def _fits(ref: Reference, forwards: list[ReplayData]) -> None:
    hidden = next((f.tensors["layer_in"].shape[-1] for f in forwards if "layer_in" in f.tensors), None)
    if hidden is not None and hidden != ref.hidden:
        raise ProbeInputError(f"the checkpoint's hidden size is {ref.hidden}, the trace's draft ran {hidden}: not this trace's draft")
    fc = ref.w.get("fc.weight")
    width = next((f.tensors["hidden_in"].shape[-1] for f in forwards if "hidden_in" in f.tensors), None)
    if fc is not None and width not in (None, fc.shape[1], ref.hidden):
        raise ProbeInputError(f"the checkpoint's fc reads {fc.shape[1]} wide, the trace's fused input is {width}: not this trace's draft")


def _measure(variant: Variant, rows: ProbeRows, steps: int) -> VariantResult | None:
    hits = total = 0
    for fwd, picked, label in rows.forwards:
        got = predict(variant, fwd.tensors)
        if got is None:
            return None
        got = got.reshape(-1)
        keep = picked[picked < got.numel()]
        hits += int((got[keep] == label[: keep.numel()]).sum())
        total += int(keep.numel())
    if total == 0:
        return None
    a = hits / total
    low, high = wilson(hits, total)
    return VariantResult(
        name=variant.name,
        axis=variant.axis,
        hits=hits,
        rows=total,
        agreement=a,
        low=low,
        high=high,
        chain=chain_accept_length(a, steps),
        fix=variant.fix,
    )


def _decide(result: ProbeResult) -> None:
    """A variant wins only measurably: its interval lies wholly above the served draft's."""
    served = next((v for v in result.variants if v.axis == "served"), None)
    result.rows = served.rows if served is not None else max((v.rows for v in result.variants), default=0)
    result.decided = sorted({v.axis for v in result.variants} - {"served", "config"})
    if served is None:
        result.notes.append("the served draft's mapped top-1 (target_ids) was not kept: no variant can be judged against it")
        result.winner = "unknown"
        return
    better = [v for v in result.variants if v.axis != "served" and v.low > served.high]
    if better:
        best = max(better, key=lambda v: (v.agreement, v.axis == "config"))
        # Two settings of one axis that both beat the served draft, but not each other (RoPE
        # bases 10000 and 500000 on short positions): the target's own is named, the setting
        # a trainer copies, not the one a few rows happened to favour.
        own = [v for v in better if v.axis == best.axis and v is not best and v.name.endswith(TARGETS_OWN) and v.high >= best.low]
        if own:
            result.notes.append(
                f"{best.name} agrees {best.agreement:.3f} and {own[0].name} {own[0].agreement:.3f}, not measurably apart: "
                "the target's own setting is named"
            )
            best = own[0]
        result.served_wins, result.winner = False, best.name


def _steps(path: str, meta: ReplayMeta, asked: int | None) -> tuple[int, str, float | None]:
    """(k, where it came from, the trace's mean greedy accept length) from the acceptance
    records of the trace beside the replay file, else of the folder's other traces (vLLM
    records acceptance in its engine's process, the replay in its worker's)."""
    folder = os.path.dirname(path) or "."
    names = [meta.trace] if meta.trace else []
    try:
        names += sorted(n for n in os.listdir(folder) if n.endswith(".jsonl") and n != meta.trace)
    except OSError:
        pass
    proposed: Counter[int] = Counter()
    lengths: list[int] = []
    for name in names:
        _acceptance(os.path.join(folder, name), proposed, lengths)
        if proposed:
            break
    live = mean_accept_length(lengths) if lengths else None
    if asked is not None:
        return asked, "--steps", live
    if proposed:
        return proposed.most_common(1)[0][0], "the trace's acceptance records", live
    return DEFAULT_STEPS, f"the usual default ({DEFAULT_STEPS}; the trace has no acceptance records: --steps sets it)", live


def _acceptance(trace: str, proposed: Counter[int], lengths: list[int]) -> None:
    """Count one trace file's proposals per verify step and collect its greedy accept lengths."""
    if not os.path.isfile(trace) or os.path.getsize(trace) > MAX_TRACE_BYTES:
        return
    try:
        with open(trace, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if '"acceptance"' not in line:
                    continue
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(rec, dict) or rec.get("type") != "acceptance":
                    continue
                if isinstance(rec.get("draft_tokens"), int):
                    proposed[rec["draft_tokens"]] += 1
                greedy = rec.get("greedy")
                for i, n in enumerate(rec.get("accept_lengths") or []):
                    if isinstance(n, int) and (not isinstance(greedy, list) or i >= len(greedy) or greedy[i]):
                        lengths.append(n)
    except OSError:
        return


def render(result: ProbeResult) -> str:
    """Each variant's agreement with its interval and chain estimate, then the verdict."""
    lines = [
        f"probe: {result.rows} row(s) ({result.rows_used}; {result.written_rows} of {result.paired_rows} paired rows "
        f"target-written), draft {result.draft}",
        f"  estimated accept length: 1 + a + a^2 + ... + a^k, a = first-step agreement, k = {result.steps} (from {result.steps_from})",
    ]
    width = max((len(v.name) for v in result.variants), default=10) + 1
    for v in sorted(result.variants, key=lambda v: (v.axis != "served", -v.agreement)):
        mark = " <- wins" if v.name == result.winner and not result.served_wins else ""
        lines.append(f"  {v.name:<{width}} agreement {v.agreement:.3f} [{v.low:.3f}, {v.high:.3f}]  accept ~{v.chain:.2f}{mark}")
    if result.live_accept_length is not None:
        lines.append(f"  live (the trace's greedy steps): accept length {result.live_accept_length:.2f}")
    served = next((v for v in result.variants if v.axis == "served"), None)
    if result.served_wins and served is not None:
        lines.append(f"verdict: served as trained: no variant agrees measurably better than the served draft ({served.agreement:.3f})")
    elif served is not None:
        win = next(v for v in result.variants if v.name == result.winner)
        lines.append(
            f"verdict: {win.name} agrees measurably better: {win.agreement:.3f} [{win.low:.3f}, {win.high:.3f}] against "
            f"{served.agreement:.3f} [{served.low:.3f}, {served.high:.3f}] as served (accept ~{win.chain:.2f} vs ~{served.chain:.2f})"
        )
        lines.append(f"  fix: {win.fix}")
    lines += [f"note: {n}" for n in result.notes]
    return "\n".join(lines)
