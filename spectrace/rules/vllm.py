"""What vLLM does with an EAGLE-3 draft, read from its source: one table for the runtime
checks (``integrations/vllm``) and the offline audit (``spectrace audit --engine vllm==V``).

vLLM's convention: id k is boundary k (Hugging Face ``hidden_states[k]``), id 0 is the
embedding. The Llama-family targets capture the stream entering their first layer (id 0)
and the stream after each layer ``idx`` as id ``idx + 1``, so ids 0..n are reachable on an
n-layer target and anything else captures nothing, without a word. The capture set is
``tuple(sorted(set(ids)))`` (``EagleModelMixin._set_aux_hidden_state_layers``): duplicates
collapse.

Where the ids come from depends on the model runner:

- V1 (``v1/worker/gpu_model_runner.py::_get_eagle3_aux_layers_from_config``): the draft
  config's top-level ``eagle_aux_hidden_state_layer_ids``, else
  ``eagle_config.eagle_aux_hidden_state_layer_ids``;
- Model Runner V2 (``v1/worker/gpu/spec_decode/eagle/eagle3_utils.py::
  get_eagle3_aux_layers_from_config``): the top-level ids, else ``eagle_config.layer_ids``;
  ids nested as ``eagle_config.eagle_aux_hidden_state_layer_ids`` (the SpecForge format)
  are not read, and the target captures its defaults ``(2, n//2, n-3)``.

    >>> vllm_runner_ids({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]}}, "mrv2")
    (None, 'defaults (2, n//2, n-3)')
    >>> vllm_boundaries([0, 2, 5], 4)
    [0, 2]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Runner = Literal["v1", "mrv2"]
RUNNERS: tuple[str, ...] = ("v1", "mrv2")
RUNNER_NAMES = {"v1": "the V1 model runner", "mrv2": "Model Runner V2"}
# Releases whose draft classes, runners and loader were read for this table.
VLLM_READ: tuple[str, ...] = ("0.32.0",)
VLLM_LATEST_READ = VLLM_READ[-1]
IDS_KEY = "eagle_aux_hidden_state_layer_ids"
DEFAULTS = "defaults (2, n//2, n-3)"
# The draft classes that load an EAGLE-3 checkpoint (model_executor/models/*_eagle3.py).
DRAFT_CLASSES: tuple[str, ...] = ("Eagle3LlamaForCausalLM", "Eagle3Qwen3ForCausalLM", "Eagle3DeepseekV2ForCausalLM")
# Where d2t goes: an nn.Parameter of zeros until the checkpoint writes it.
D2T_PARAM = "draft_id_to_target_id"


@dataclass(frozen=True)
class VLLMRelease:
    """One vLLM release's EAGLE-3 behaviour, as read from its source."""

    version: str
    read: bool  # False: modelled on the nearest release read
    default_runner_gpu: Runner  # what a CUDA server runs unless VLLM_USE_V2_MODEL_RUNNER says otherwise
    default_runner_cpu: Runner  # no Triton CPU backend: V1
    unknown_names_raise: bool = True  # AutoWeightsLoader: "There is no module or parameter named ..."
    biases_dropped: bool = True  # AutoWeightsLoader ignores unexpected ".bias" names (meant for GPTQ)
    fc_bias: bool = False  # the draft's fc is built with bias=False whatever the config says


def vllm_release(version: str | None) -> VLLMRelease:
    """The facts for ``version`` (the latest release read when None)."""
    version = version or VLLM_LATEST_READ
    return VLLMRelease(version=version, read=version in VLLM_READ, default_runner_gpu="mrv2", default_runner_cpu="v1")


def default_ids(num_layers: int) -> list[int]:
    """``SupportsEagle3.get_eagle3_default_aux_hidden_state_layers`` for an n-layer target."""
    n = num_layers
    return [2, n // 2, n - 3]


def vllm_boundaries(ids: Sequence[int], num_layers: int) -> list[int]:
    """The boundaries a Llama-family vLLM target captures for ``ids``: sorted, distinct, 0..n."""
    return sorted({int(i) for i in ids if 0 <= int(i) <= num_layers})


def _as_ids(value: Any) -> list[int] | None:
    if isinstance(value, (list, tuple)) and value:
        try:
            return [int(i) for i in value]
        except (TypeError, ValueError):
            return None
    return None


def vllm_runner_ids(config: Mapping[str, Any], runner: str) -> tuple[list[int] | None, str]:
    """The ids ``runner`` reads from a draft config.json (after vLLM's speculators reader,
    which keeps top-level ids at the top level), and where they came from."""
    top = _as_ids(config.get(IDS_KEY))
    if top is not None:
        return top, f"top-level {IDS_KEY}"
    eagle = config.get("eagle_config")
    eagle = eagle if isinstance(eagle, Mapping) else {}
    if runner == "v1":
        nested = _as_ids(eagle.get(IDS_KEY))
        if nested is not None:
            return nested, f"eagle_config.{IDS_KEY}"
    else:
        nested = _as_ids(eagle.get("layer_ids"))
        if nested is not None:
            return nested, "eagle_config.layer_ids"
    return None, DEFAULTS


def ignored_nested_ids(config: Mapping[str, Any], runner: str) -> list[int] | None:
    """Ids nested in ``eagle_config`` that ``runner`` does not read (None: nothing ignored)."""
    if runner != "mrv2" or _as_ids(config.get(IDS_KEY)) is not None:
        return None
    eagle = config.get("eagle_config")
    if not isinstance(eagle, Mapping) or _as_ids(eagle.get("layer_ids")) is not None:
        return None
    return _as_ids(eagle.get(IDS_KEY))


def uses_aux_hidden_state(config: Mapping[str, Any]) -> bool:
    """``eagle_config.use_aux_hidden_state`` (default true), as ``llama_eagle3.LlamaModel`` reads it."""
    eagle = config.get("eagle_config")
    if isinstance(eagle, Mapping) and "use_aux_hidden_state" in eagle:
        return bool(eagle["use_aux_hidden_state"])
    return True
