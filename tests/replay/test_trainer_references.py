"""The trainers' own models and spectrace's built-in reference compute the same modules.

Each committed fixture checkpoint (written by the trainer itself: tests/fixtures/README.md)
is loaded both ways and fed the same inputs: fc (after the input norms its flags ask
for), the decoder layer at positions 0.., the final norm, the head. speculators' fixture
has ``norm_before_fc``, ``norm_before_residual`` and ``norm_output`` on, so the built-in
reference's reading of those flags is checked against the trainer's code. A reference
that reads a flag otherwise, or a RoPE base other than the config's, fails here.

speculators lives in the vLLM test environment (scripts/install-vllm-cpu.sh), SpecForge in
the main one (scripts/install-sglang-cpu.sh).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from spectrace.replay.reference import Reference  # noqa: E402
from spectrace.replay.trainer_model import TrainerReference  # noqa: E402
from spectrace.replay.weights import load_draft  # noqa: E402
from tests.helpers import paths  # noqa: E402

FIXTURES = paths.ROOT / "tests" / "fixtures"


def _agree(folder: Path, trainer: type[TrainerReference], rope_theta: float | None = None) -> dict[str, float]:
    """Each module's largest difference between the two references, over its largest value."""
    ckpt, raw, tensors = load_draft(folder)
    for name in [n for n in tensors if n.endswith(("q_proj.weight", "k_proj.weight"))]:
        # The fixtures' attention is near uniform (random 0.02 weights), where no rotary base
        # shows; scaled, it is sharp as in a trained draft. Both references get these weights.
        tensors[name] = tensors[name] * 16
    builtin = Reference.build(ckpt, raw, tensors)
    if rope_theta is not None:
        builtin.rope_theta = rope_theta  # the built-in reference told another base than the config's
    theirs = trainer.wrap(Reference.build(ckpt, raw, tensors), raw, tensors)
    g = torch.Generator().manual_seed(3)
    rows, hidden = 12, builtin.hidden
    width = builtin.w["fc.weight"].shape[1]
    fused, embeds, state = (
        torch.randn(rows, width, generator=g),
        torch.randn(rows, hidden, generator=g),
        torch.randn(rows, hidden, generator=g),
    )
    positions = torch.arange(rows)
    pairs = {
        "fc": (builtin.fc(fused), theirs.fc(fused)),
        "decoder layer": (builtin.layer(positions, embeds, state), theirs.layer(positions, embeds, state)),
        "final norm": (builtin.norm(state), theirs.norm(state)),
        "lm_head": (builtin.head_weight(), theirs.head_weight()),
    }
    out = {}
    for module, (a, b) in pairs.items():
        assert a is not None and b is not None, module
        a, b = a.float(), b.float()
        if module == "lm_head":  # the trainers save their placeholder NaN head when no verifier's was loaded
            assert torch.equal(a.isnan(), b.isnan()), module
            a, b = a.nan_to_num(), b.nan_to_num()
        out[module] = float((a - b).abs().max() / a.abs().max().clamp_min(1e-12))
    return out


@pytest.mark.vllm
def test_speculators_model_and_the_builtin_reference_agree_with_its_flags_on() -> None:
    pytest.importorskip("speculators", reason="needs scripts/install-vllm-cpu.sh (it installs speculators)")
    from spectrace.replay.trainer_speculators import SpeculatorsReference

    folder = FIXTURES / "speculators_tiny"
    flags = json.loads((folder / "config.json").read_text())
    assert flags["norm_before_fc"] and flags["norm_before_residual"] and flags["norm_output"]
    errors = _agree(folder, SpeculatorsReference)
    assert max(errors.values()) < 1e-5, errors
    # The comparison can fail: a base other than the config's moves the decoder layer only.
    errors = _agree(folder, SpeculatorsReference, rope_theta=500000.0)
    assert errors["decoder layer"] > 1e-2 and errors["fc"] < 1e-5, errors


def test_specforge_model_and_the_builtin_reference_agree() -> None:
    pytest.importorskip("specforge", reason="needs scripts/install-sglang-cpu.sh (it installs SpecForge)")
    from spectrace.replay.trainer_specforge import SpecForgeReference

    errors = _agree(FIXTURES / "specforge_tiny", SpecForgeReference)
    assert max(errors.values()) < 1e-5, errors
    errors = _agree(FIXTURES / "specforge_tiny", SpecForgeReference, rope_theta=500000.0)
    assert errors["decoder layer"] > 1e-2 and errors["fc"] < 1e-5, errors
