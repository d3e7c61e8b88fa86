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
