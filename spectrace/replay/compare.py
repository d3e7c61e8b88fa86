"""Compare each served module with the reference fed the same served inputs.

Each module is judged on its own inputs as served (the reference's fc reads the served
fused input, its decoder layer the served embeddings and fc output, and so on), so the
first module in data-path order whose output differs beyond the dtype's tolerance is the
one that computes something else, not merely one downstream of it.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from pydantic import BaseModel, Field

from .file import ReplayData
from .reference import Reference

ORDER = ("embed", "fc", "decoder layer", "final norm", "lm_head", "vocabulary map")
# Relative to the reference's largest magnitude: float32 kernels differ in summation order
# only; half precision rounds every stored output.
TOLERANCE = {"float32": 2e-3, "float64": 2e-3, "bfloat16": 5e-2, "float16": 1e-2}
CAUSES: dict[str, list[str]] = {
    "embed": ["the engine shares the target's embedding (set_embed) where the checkpoint trained its own (embed_requires_grad)"],
    "fc": [
        "fc's weights are not the checkpoint's (dropped or mis-named at load)",
        "an input norm the trainer used is missing or extra (fc_norm, norm_before_fc)",
    ],
    "decoder layer": [
        "the rotary embedding differs: RoPE base (rope_theta) or style (neox / interleaved), or its scaling",
        "positions other than the trainer's",
        "the attention mask (a window, or non-causal rows)",
        "the residual: norm_before_residual (the trainer adds the normed hidden state, SGLang the raw one)",
        "the layer's weights are not the checkpoint's (q/k/v or gate/up shards, a name dropped at load)",
    ],
    "final norm": ["the norm's weight, or norm_output / norm_before_residual read differently than the trainer did"],
    "lm_head": [
        "the trained lm_head was replaced or shared from the target (SGLang: draft_vocab_size null makes the worker load "
        "the target's head), or sliced by the hot-token map",
    ],
    "vocabulary map": ["the engine maps draft ids to other target ids than the checkpoint's d2t (hot_token_id, t2d)"],
}


class ModuleCheck(BaseModel):
    module: str
    compared: bool = Field(description="whether the served values and the reference's were both there")
    max_error: float | None = Field(None, description="largest |served - reference| over the reference's largest magnitude")
    tolerance: float | None = None
    agrees: bool = True
    note: str = ""


class ReplayResult(BaseModel):
    """What ``spectrace replay`` concluded; written beside the trace as ``<stem>.replay.json``."""

    format: str = "spectrace.replay-result/1"
    trace: str = ""
    replay_file: str = ""
    draft: str = ""
    reference: str = "builtin"
    engine: str = ""
    dtype: str = ""
    forwards: int = 0
    rows: int = 0
    agree: bool = True
    first_divergence: str | None = None
    served: str = Field("", description="what the served module computed (first diverging row, first values)")
    expected: str = Field("", description="what the reference computed on the same inputs")
    causes: list[str] = []
    modules: list[ModuleCheck] = []
    notes: list[str] = []


def _error(served: torch.Tensor, ref: torch.Tensor) -> float:
    s, r = served.float().reshape(ref.shape), ref.float()
    return float((s - r).abs().max() / r.abs().max().clamp_min(1e-6))


def _first_bad_row(served: torch.Tensor, ref: torch.Tensor, tol: float) -> int:
    """The first row whose error passes ``tol`` (row 0 when none does, or a row has no width):
    a rotary difference changes nothing at position 0, so row 0 would show two equal rows."""
    if ref.dim() < 2:
        return 0
    s, r = served.float().reshape(ref.shape).reshape(ref.shape[0], -1), ref.float().reshape(ref.shape[0], -1)
    per_row = (s - r).abs().amax(dim=1) / r.abs().max().clamp_min(1e-6)
    bad = (per_row > tol) | ~torch.isfinite(per_row)
    return int(bad.nonzero()[0, 0]) if bool(bad.any()) else 0


def _show(t: torch.Tensor, row: int = 0, positions: torch.Tensor | None = None) -> str:
    """Row ``row``'s first values, with the row (and its position) named past row 0."""
    if not t.dim():
        return "[" + f"{float(t):.4g}" + ", ...]"
    values = t.float().reshape(t.shape[0], -1)[row][:4]
    text = "[" + ", ".join(f"{v:.4g}" for v in values.tolist()) + ", ...]"
    if row == 0:
        return text
    where = f"row {row}"
    if positions is not None and positions.numel() > row:
        where += f" (position {int(positions.reshape(-1)[row])})"
    return f"{where}: {text}"


def module_pairs(ref: Reference, t: dict[str, torch.Tensor]) -> dict[str, tuple[Any, Any, str]]:
    """(served, reference, note) per module; None where one side is missing."""
    out: dict[str, tuple[Any, Any, str]] = {}
    ids = t.get("input_ids")
    embeds = t.get("embeds")
    ref_embed = ref.embed(ids) if ids is not None else None
    if ref_embed is None:
        out["embed"] = (None, None, "the checkpoint has no embed_tokens (the engine's is used)")
    else:
        out["embed"] = (embeds, ref_embed, "")
    fc_out = t.get("fc_out")
    if (
        fc_out is not None
        and t.get("hidden_in") is not None
        and t["hidden_in"].shape[-1] == (ref.w["fc.weight"].shape[1] if "fc.weight" in ref.w else -1)
    ):
        out["fc"] = (fc_out, ref.fc(t["hidden_in"]), "")
    elif fc_out is not None and t.get("fc_in") is not None:
        out["fc"] = (fc_out, ref.fc_only(t["fc_in"]), "from fc's own input (the fused input was not kept)")
    else:
        out["fc"] = (None, None, "fc did not run")
    layer_in, layer_out = t.get("layer_in"), t.get("layer_out")
    if layer_in is not None and layer_out is not None and embeds is not None:
        positions = t.get("positions")
        positions = positions.long() if positions is not None else torch.arange(layer_in.shape[0])
        out["decoder layer"] = (layer_out, ref.layer(positions, embeds, layer_in), "")
    else:
        out["decoder layer"] = (None, None, "the layer's inputs were not kept")
    norm_out = t.get("norm_out")
    out["final norm"] = (norm_out, ref.norm(layer_out) if layer_out is not None else None, "")
    head = ref.head_weight()
    top_ids, top_values = t.get("topk_ids"), t.get("topk_values")
    if head is None:
        out["lm_head"] = (None, None, "the checkpoint has no lm_head to compare with")
    elif top_ids is not None and top_values is not None and norm_out is not None:
        if int(top_ids.max()) >= head.shape[0]:
            out["lm_head"] = (
                top_values,
                None,
                f"the served head scores ids up to {int(top_ids.max())}; the checkpoint's has {head.shape[0]} rows",
            )
        else:
            out["lm_head"] = (top_values, (norm_out.float() @ head.t()).gather(-1, top_ids.long()), "")
    else:
        out["lm_head"] = (None, None, "the logits were not kept")
    target = t.get("target_ids")
    if target is not None and top_ids is not None and (ref.d2t is None or int(top_ids.max()) < len(ref.d2t)):
        out["vocabulary map"] = (target, ref.target_ids(top_ids), "")
    else:
        out["vocabulary map"] = (None, None, "the mapped ids were not kept")
    return out


def _note(compared: list[str], skipped: list[str], forwards: int) -> str:
    """Both sides of a module's verdict: what its compared forwards said, and why the others
    were not compared (named with their count when some forwards were compared)."""
    said = list(dict.fromkeys(n for n in compared if n))
    missing = list(dict.fromkeys(n for n in skipped if n))
    if compared and missing:
        others = "the other" if len(skipped) == 1 else f"the other {len(skipped)}"
        said.append(f"compared in {len(compared)} of {forwards} forwards; {others}: " + "; ".join(missing))
    elif not compared:
        said += missing
    return "; ".join(said)


def compare(ref: Reference, forwards: list[ReplayData], dtype: str) -> ReplayResult:
    """The module-by-module verdict over every kept forward."""
    tol = TOLERANCE.get(dtype, 5e-2)
    checks = {m: ModuleCheck(module=m, compared=False, tolerance=tol) for m in ORDER}
    shown: dict[str, tuple[str, str]] = {}
    # Per module: the notes of the forwards it was compared in, and of those it was not (a
    # later draft step without fc must not hide what the first forward showed).
    compared_notes: dict[str, list[str]] = {m: [] for m in ORDER}
    skipped_notes: dict[str, list[str]] = {m: [] for m in ORDER}
    for fwd in forwards:
        positions = fwd.tensors.get("positions")
        for module, (served, expected, note) in module_pairs(ref, fwd.tensors).items():
            check = checks[module]
            if served is None:
                skipped_notes[module].append(note)
                continue
            if expected is None:  # the served side exists and the checkpoint cannot produce it
                check.compared, check.agrees = True, False
                compared_notes[module].append(note)
                shown.setdefault(module, (_show(served), note))
                continue
            check.compared = True
            compared_notes[module].append(note)
            if module == "vocabulary map":
                bad = bool((served.long() != expected.long()).any())
                error = 1.0 if bad else 0.0
            else:
                error = _error(served, expected)
                if not math.isfinite(error):  # NaN or inf on either side diverges: it never "agrees" silently
                    side = "the reference" if not bool(torch.isfinite(expected.float()).all()) else "the served draft"
                    check.agrees = False
                    compared_notes[module][-1] = f"{side} computed NaN or inf (a checkpoint tensor left at a trainer's NaN placeholder?)"
                    row = _first_bad_row(served, expected, tol)
                    shown.setdefault(module, (_show(served, row, positions), _show(expected, row, positions)))
                    continue
                bad = error > tol
            check.max_error = max(check.max_error or 0.0, error)
            if bad:
                check.agrees = False
                row = 0 if module == "vocabulary map" else _first_bad_row(served, expected, tol)
                if module == "vocabulary map" and expected.dim():
                    differs = (served.long().reshape(expected.shape) != expected.long()).reshape(expected.shape[0], -1).any(dim=1)
                    row = int(differs.nonzero()[0, 0])
                shown.setdefault(module, (_show(served, row, positions), _show(expected, row, positions)))
    for module in ORDER:
        checks[module].note = _note(compared_notes[module], skipped_notes[module], len(forwards))
    first = next((m for m in ORDER if not checks[m].agrees), None)
    result = ReplayResult(
        dtype=dtype,
        forwards=len(forwards),
        rows=sum(f.meta.rows for f in forwards),
        agree=first is None,
        first_divergence=first,
        modules=[checks[m] for m in ORDER],
        notes=list(ref.notes),
    )
    if first is not None:
        result.served, result.expected = shown[first]
        result.causes = CAUSES[first]
    return result
