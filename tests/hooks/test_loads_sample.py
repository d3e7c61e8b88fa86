"""The load fingerprint reads its sample positions as int64 whatever the parameter's dtype.

Live on the H200 (SGLang 0.5.17, --dtype float16), positions built in the parameter's own
dtype rounded past 2048 and indexed out of bounds: a device-side assert that killed every
SPECTRACE=1 server at the draft's load. On the CPU the same index raised and was swallowed."""

import pytest
import torch

from spectrace.integrations.core.loads import LOADED_SAMPLES, _positions, _sample


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_sample_positions_stay_exact_in_half_precision(dtype):
    numel = 64 * 192  # the trained draft's fc: 12288 values, past fp16's exact integers
    t = torch.arange(numel, dtype=torch.float32).to(dtype).reshape(64, 192)
    got = _sample(t)
    assert got is not None and len(got) == LOADED_SAMPLES
    flat = t.reshape(-1)
    assert list(got) == [float(flat[i]) for i in _positions(numel)]


def test_a_parameter_without_a_loader_is_loaded_as_the_engines_load_it() -> None:
    # SGLang's and vLLM's default_weight_loader refuse a misfit with an AssertionError; the
    # observer must neither broadcast it into the parameter nor raise another error.
    import torch

    from spectrace.hooks.weights import observe_load

    model = torch.nn.Linear(4, 4, bias=False)

    def load(weights):
        for _, tensor in weights:
            getattr(model.weight, "weight_loader", None)(model.weight, tensor)

    before = model.weight.detach().clone()
    with pytest.raises(AssertionError, match="Attempted to load weight"):
        observe_load(model, load, [("weight", torch.ones(4))], module="m")
    assert torch.equal(model.weight, before)  # nothing broadcast into it
    _, record = observe_load(model, load, [("weight", torch.ones(4, 4))], module="m")
    assert torch.equal(model.weight, torch.ones(4, 4)) and record.written == ["weight"]
