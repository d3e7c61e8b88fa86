"""Findings from the widths of the hidden states a draft receives (facts from any engine).

The draft applies ``fc`` only when its input is wider than the embedding (SGLang:
``if hidden_states.shape[-1] != embeds.shape[-1]``): an input exactly ``hidden`` wide
is the silent fc bypass; any other width that is not ``fc.in_features``
is a plain shape mismatch. A target that captured no aux states and stored its final
hidden state instead is the start of the same bug.

    >>> [f.code for f in check_draft_input_width(64, 192, 64, "EXTEND")]
    ['fc_bypass']
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..records import Finding
from ..rules.catalogue import finding


def check_draft_input_width(
    seen: int,
    expected: int | None,
    hidden: int | None,
    mode: str,
    captured_boundaries: Sequence[int] | None = None,
    *,
    source: str = "",
    last_state: str | None = None,
) -> list[Finding]:
    """The draft got ``seen``-wide hidden states where ``fc`` takes ``expected``.

    ``last_state``: why the draft was trained on the target's last hidden state (its fc is built
    but was never trained): an input as wide as the embedding is then what it was trained on."""
    if expected is None or seen == expected or (last_state and seen == hidden):
        return []
    evidence: dict[str, Any] = {
        "seen_width": seen,
        "fc_in_features": expected,
        "hidden_size": hidden,
        "forward_mode": mode,
        "captured_boundaries": list(captured_boundaries) if captured_boundaries is not None else None,
    }
    if seen == hidden:
        return [
            finding(
                "fc_bypass",
                f"the draft got {seen}-wide hidden states in {mode} but fc expects {expected}: {seen} equals the "
                "embedding width, so SGLang skipped fc and the draft runs on inputs it was never trained on",
                module="draft.model.fc",
                evidence=evidence,
                fix=_width_fix(expected, hidden),
                source=source,
            )
        ]
    return [
        finding(
            "shape_mismatch",
            f"the draft got {seen}-wide hidden states in {mode}; fc expects {expected} (hidden {hidden})",
            module="draft.model.fc",
            evidence=evidence,
            fix=_width_fix(expected, hidden),
            source=source,
        )
    ]


def check_stored_hidden(width: int, capture_mode: str, *, source: str = "", last_state: str | None = None) -> list[Finding]:
    """The target stored its final normed hidden state for an EAGLE-3 draft (no aux capture);
    nothing for a draft trained on it (``last_state``: why)."""
    if last_state:
        return []
    return [
        finding(
            "logits_fallback",
            f"the target captured no aux hidden states, so the logits processor stored its final normed hidden "
            f"state ({width} wide) for the EAGLE-3 draft instead of the aux concat",
            module="target.logits_processor",
            evidence={"stored_width": width, "capture_hidden_mode": capture_mode},
            fix="launch with --speculative-algorithm EAGLE3 and set eagle_config.use_aux_hidden_state=true, so the "
            f"target stores its aux concat instead of this {width}-wide state",
            source=source,
        )
    ]


def check_target_handoff_width(
    width: int, fc_in: int, embed_width: int, num_aux: int, *, aux_enabled: bool, module: str, step: int | None, source: str = ""
) -> list[Finding]:
    """The hidden states a target hands its draft are not ``fc.in_features`` wide (the
    reference pipeline sees them at the hand-off, before the draft runs)."""
    if width == fc_in:
        return []
    code = "fc_bypass" if width == embed_width else "shape_mismatch"
    what = "fc was skipped: the draft runs on inputs it was never trained on" if code == "fc_bypass" else "fc cannot take them"
    return [
        finding(
            code,
            f"the target handed the draft {width}-wide hidden states, fc expects {fc_in} ({num_aux} x {fc_in // num_aux}); {what}",
            module=module,
            evidence={"seen_width": width, "fc_in_features": fc_in, "embed_width": embed_width, "aux_enabled": aux_enabled},
            fix=_width_fix(fc_in, fc_in // num_aux if num_aux else None),
            step=step,
            source=source,
        )
    ]


def check_graph_buffer_width(seen: int, expected: int, runner: str, *, source: str = "") -> list[Finding]:
    """A CUDA-graph runner got hidden states of another width than its captured buffer: the
    engine skips the copy and replays the graph on stale states."""
    if seen == expected:
        return []
    return [
        finding(
            "fc_bypass",
            f"the draft-extend CUDA graph got {seen}-wide hidden states but its buffer is {expected} wide "
            "(target hidden x num aux): SGLang skips the copy and replays the graph on stale hidden states",
            module="draft.cuda_graph_runner_for_draft_extend",
            evidence={"seen_width": seen, "fc_in_features": expected, "runner": runner},
            fix=f"make the target hand the draft {expected}-wide hidden states, the width the graph buffer was "
            "captured with (the same aux layers at every forward), or serve with --disable-cuda-graph to see the "
            "fresh states",
            source=source,
        )
    ]


def _width_fix(fc_in: int, hidden: int | None) -> str:
    """The width fc takes, in aux layers: what the target must capture."""
    if hidden and fc_in % hidden == 0:
        n = fc_in // hidden
        return (
            f"make the target capture {n} aux layers ({n} x {hidden} = {fc_in}, fc.in_features): launch with "
            f"--speculative-algorithm EAGLE3, eagle_config.use_aux_hidden_state=true and {n} ids in "
            "eagle_config.eagle_aux_hidden_state_layer_ids, all below the target's layer count"
        )
    return f"make the target hand the draft {fc_in}-wide hidden states (fc.in_features = num aux x target hidden size)"
