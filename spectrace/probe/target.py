"""The target's boundary states at the kept rows, recomputed from its checkpoint (``--target``).

The replay capture keeps the target's ids and its top-1 at the kept rows, not its states at
every layer boundary (a whole model's worth per row). Given the target's folder, the probe
runs it in plain transformers on those ids and gets every boundary (``hidden_states[b]``:
0 = the embedding output, b = the output of block b - 1), and its head: enough to try each
reading of the draft's capture ids and the target's head as the draft's. The recomputed
top-1 is checked against the one the engine's target chose at the same rows, so a folder
that is not the served target is named, not used.

Weights are read from safetensors only (``use_safetensors``): a pickle is never executed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


class TargetModelError(ValueError):
    """A target folder the probe cannot use (a one-line message)."""


def load_target(folder: Path) -> Any:
    """The target as a transformers causal LM in float32, eval mode (no remote code, safetensors only)."""
    if not (folder / "config.json").is_file():
        raise TargetModelError(f"--target {folder}: no config.json there")
    try:
        from transformers import AutoModelForCausalLM
    except ImportError:
        raise TargetModelError("--target needs transformers (pip install spectrace[transformers])") from None
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(folder), dtype=torch.float32, use_safetensors=True, trust_remote_code=False, attn_implementation="sdpa"
        )
    except Exception as exc:  # transformers' own errors: a missing file, an unknown architecture
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TargetModelError(f"--target {folder}: transformers could not load it ({first[:160]})") from None
    return model.eval()


def target_rows(model: Any, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(boundaries 0 .. L-1 at each row, (L, T, hidden); the target's top-1 at each row). The
    last of transformers' hidden states is already normed, so boundary L is not given."""
    with torch.no_grad():
        out = model(input_ids=ids.long().view(1, -1), output_hidden_states=True, use_cache=False)
    states = torch.stack([h[0] for h in out.hidden_states[:-1]]).float()
    return states, out.logits[0].argmax(-1)


def head_weight(model: Any) -> torch.Tensor:
    """The target's output head (tied to its embedding where the config ties them)."""
    return model.get_output_embeddings().weight.detach().float()
