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
  get_eagle3_aux_layers_from_config``, the same in 0.32.0 and 0.33.0), first source that
  gives ids: the top-level ids; ``dflash_config.target_layer_ids`` + 1;
  ``dspark_target_layer_ids`` (+ 1, except ``model_type`` deepseek_v41); the top-level
  ``target_layer_ids`` + 1; ``dflash_config.layer_ids``, then ``eagle_config.layer_ids``.
  Ids nested as ``eagle_config.eagle_aux_hidden_state_layer_ids`` (the SpecForge format)
  are not read, and the target captures its defaults ``(2, n//2, n-3)``, logged at info
  level only ("Using Eagle3 auxiliary layers from model").

``eagle_config.use_aux_hidden_state=false``: the draft classes build no fc in both
releases. Model Runner V2 of 0.32.0 still makes the target return its aux states
(``use_aux_hidden_state_outputs = True`` for every eagle3 server); 0.33.0 asks
``requires_aux_hidden_states``, which reads the flag. Which training flags each draft
class implements is :data:`CLASS_FLAGS` (identical in both releases read).

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
VLLM_READ: tuple[str, ...] = ("0.32.0", "0.33.0")
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
    # Model Runner V2 reads eagle_config.use_aux_hidden_state before asking the target for aux
    # states (eagle3_utils.requires_aux_hidden_states, from 0.33.0; vllm#40551).
    mrv2_reads_use_aux: bool = True
    ids_fallback_log: str = "info"  # the level of "Using Eagle3 auxiliary layers from model" (vllm#50170)


def vllm_release(version: str | None) -> VLLMRelease:
    """The facts for ``version`` (the latest release read when None; a release not read is
    modelled on the nearest one read)."""
    version = version or VLLM_LATEST_READ
    return VLLMRelease(
        version=version,
        read=version in VLLM_READ,
        default_runner_gpu="mrv2",
        default_runner_cpu="v1",
        mrv2_reads_use_aux=_at_least(version, "0.33.0"),
    )


def _at_least(version: str, floor: str) -> bool:
    def key(v: str) -> tuple[int, ...]:
        out = []
        for part in v.split(".")[:3]:
            digits = "".join(ch for ch in part if ch.isdigit()) or "0"
            out.append(int(digits))
        return tuple(out)

    return key(version) >= key(floor)


# Training flags each draft class reads (``getattr(config, flag)`` / ``eagle_config``), read
# from model_executor/models/{llama,qwen3,deepseek}_eagle3.py of 0.32.0 and 0.33.0: the same
# in both. A flag a class does not read is skipped without a word.
TRAINING_FLAGS: tuple[str, ...] = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")
CLASS_FLAGS: dict[str, frozenset[str]] = {
    "Eagle3LlamaForCausalLM": frozenset({*TRAINING_FLAGS, "use_aux_hidden_state"}),
    "Eagle3Qwen3ForCausalLM": frozenset({*TRAINING_FLAGS, "use_aux_hidden_state"}),
    # No norm_before_fc and no use_aux_hidden_state: fc is always built and always used.
    "Eagle3DeepseekV2ForCausalLM": frozenset({"norm_before_residual", "fc_norm", "norm_output"}),
}
# models/registry.py: the architecture name -> the class built (transformers_utils/configs/
# eagle.py prefixes "Eagle3" to an architecture that has no Eagle3 in its name).
ARCH_CLASSES: dict[str, str] = {
    "Eagle3LlamaForCausalLM": "Eagle3LlamaForCausalLM",
    "LlamaForCausalLMEagle3": "Eagle3LlamaForCausalLM",
    "Eagle3MiniMaxM2ForCausalLM": "Eagle3LlamaForCausalLM",
    "Eagle3Qwen2_5vlForCausalLM": "Eagle3LlamaForCausalLM",
    "Eagle3Qwen3vlForCausalLM": "Eagle3LlamaForCausalLM",
    "Eagle3Qwen3ForCausalLM": "Eagle3Qwen3ForCausalLM",
    "Eagle3DeepseekV2ForCausalLM": "Eagle3DeepseekV2ForCausalLM",
    "Eagle3DeepseekV3ForCausalLM": "Eagle3DeepseekV2ForCausalLM",
}


def draft_class_for(architectures: Sequence[str]) -> str:
    """The draft class vLLM builds for a draft config's ``architectures`` (Llama's when unknown).

    >>> draft_class_for(["DeepseekV3ForCausalLM"])
    'Eagle3DeepseekV2ForCausalLM'
    """
    for arch in architectures:
        name = arch if (arch.startswith("Eagle3") or arch.endswith("Eagle3")) else f"Eagle3{arch}"
        if name in ARCH_CLASSES:
            return ARCH_CLASSES[name]
    return "Eagle3LlamaForCausalLM"


def flags_set(config: Mapping[str, Any]) -> dict[str, bool]:
    """The training flags a draft config sets, as the draft classes read them
    (``norm_before_fc`` from eagle_config first; ``use_aux_hidden_state`` from eagle_config only)."""
    eagle = config.get("eagle_config")
    eagle = eagle if isinstance(eagle, Mapping) else {}
    out: dict[str, bool] = {}
    for flag in TRAINING_FLAGS:
        value = eagle.get(flag, config.get(flag)) if flag == "norm_before_fc" else config.get(flag)
        if value is not None:
            out[flag] = bool(value)
    if "use_aux_hidden_state" in eagle:
        out["use_aux_hidden_state"] = bool(eagle["use_aux_hidden_state"])
    return out


def unread_flags(config: Mapping[str, Any], draft_class: str) -> list[str]:
    """Flags set away from their default (false; ``use_aux_hidden_state``: true) that
    ``draft_class`` does not read.

    >>> unread_flags({"norm_before_fc": True}, "Eagle3DeepseekV2ForCausalLM")
    ['norm_before_fc']
    """
    implemented = CLASS_FLAGS.get(draft_class, CLASS_FLAGS["Eagle3LlamaForCausalLM"])
    out = []
    for flag, value in flags_set(config).items():
        off_default = value is False if flag == "use_aux_hidden_state" else value is True
        if off_default and flag not in implemented:
            out.append(flag)
    return out


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
        return None, DEFAULTS
    # Model Runner V2's order (eagle3_utils.get_eagle3_aux_layers_from_config).
    dflash = config.get("dflash_config")
    dflash = dflash if isinstance(dflash, Mapping) else {}
    ids = _as_ids(dflash.get("target_layer_ids"))
    if ids is not None:
        return [i + 1 for i in ids], "dflash_config.target_layer_ids + 1"
    ids = _as_ids(config.get("dspark_target_layer_ids"))
    if ids is not None:
        if config.get("model_type") == "deepseek_v41":
            return ids, "dspark_target_layer_ids"
        return [i + 1 for i in ids], "dspark_target_layer_ids + 1"
    ids = _as_ids(config.get("target_layer_ids"))
    if ids is not None:
        return [i + 1 for i in ids], "top-level target_layer_ids + 1"
    for name, nested_config in (("dflash_config", dflash), ("eagle_config", eagle)):
        ids = _as_ids(nested_config.get("layer_ids"))
        if ids is not None:
            return ids, f"{name}.layer_ids"
    return None, DEFAULTS


def ignored_nested_ids(config: Mapping[str, Any], runner: str) -> list[int] | None:
    """Ids nested in ``eagle_config`` that ``runner`` does not read (None: nothing ignored)."""
    if runner != "mrv2" or vllm_runner_ids(config, runner)[0] is not None:
        return None
    eagle = config.get("eagle_config")
    if not isinstance(eagle, Mapping):
        return None
    return _as_ids(eagle.get(IDS_KEY))


def uses_aux_hidden_state(config: Mapping[str, Any]) -> bool:
    """``eagle_config.use_aux_hidden_state`` (default true), as ``llama_eagle3.LlamaModel`` reads it."""
    eagle = config.get("eagle_config")
    if isinstance(eagle, Mapping) and "use_aux_hidden_state" in eagle:
        return bool(eagle["use_aux_hidden_state"])
    return True
