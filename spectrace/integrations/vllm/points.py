"""Where spectrace hooks vLLM: one row per patch point, confirmed on vLLM 0.32.0.

A point names a dotted target (``module.Class.method`` or ``module.function``), how the
hook runs (``BEFORE`` / ``AFTER`` / ``AROUND``) and the hook. Points of one ``feature`` are
alternatives: a feature is said "not covered" only when none of them exists. Line
numbers and semantics: docs/vllm.md ("Patch points").
"""

from __future__ import annotations

from ..core.points import Point as _CorePoint
from ..core.points import PointTable

_PKG = "spectrace.integrations.vllm"


class Point(_CorePoint):
    """A patch point whose hook lives in this package."""

    package = _PKG


M = "vllm.model_executor.models"
_DRAFTS = (
    ("llama_eagle3", "Eagle3LlamaForCausalLM", "llama"),
    ("qwen3_eagle3", "Eagle3Qwen3ForCausalLM", "qwen3"),
    ("deepseek_eagle3", "Eagle3DeepseekV2ForCausalLM", "deepseek"),
)
# The targets whose own set_aux_hidden_state_layers overrides SupportsEagle3's (they delegate
# to their language model; the capture is recorded once, on the decoder that holds it).
_OVERRIDES = (
    ("deepseek_v2", "DeepseekV2ForCausalLM"),
    ("qwen3_5", "Qwen3_5ForCausalLMBase"),
    ("kimi_k25", "KimiK25ForConditionalGeneration"),
    ("pixtral", "PixtralForConditionalGeneration"),
    ("mllama4", "Llama4ForConditionalGeneration"),
    ("transformers.base", "Base"),
)

POINTS: tuple[Point, ...] = (
    # draft weights: d2t, fc.weight, biases
    *(Point(f"{M}.{mod}", f"{cls}.load_weights", "AROUND", "weights:around_draft_load", f"draft_load_{fam}") for mod, cls, fam in _DRAFTS),
    # the draft's config (fc_bypass when use_aux_hidden_state is false) and its fc input
    *(Point(f"{M}.{mod}", f"{cls}.__init__", "AFTER", "draft:after_draft_init", f"draft_config_{fam}") for mod, cls, fam in _DRAFTS),
    *(
        Point(f"{M}.{mod}", f"{cls}.combine_hidden_states", "BEFORE", "draft:before_combine", f"draft_fc_input_{fam}")
        for mod, cls, fam in _DRAFTS
    ),
    # the target's capture, under vLLM's convention (id 0 = the embedding)
    Point(f"{M}.interfaces", "SupportsEagle3.set_aux_hidden_state_layers", "AFTER", "capture:after_set_layers", "capture"),
    *(
        Point(f"{M}.{mod}", f"{cls}.set_aux_hidden_state_layers", "AFTER", "capture:after_set_layers", f"capture_{mod}")
        for mod, cls in _OVERRIDES
    ),
    # which runner set the capture up, and from which config
    Point(
        module="vllm.v1.worker.gpu_model_runner",
        qualname="GPUModelRunner._setup_eagle3_aux_hidden_state_outputs",
        kind="AROUND",
        hook="capture:around_v1_setup",
        feature="runner_v1",
    ),
    Point(
        module="vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils",
        qualname="set_eagle3_aux_hidden_state_layers",
        kind="AROUND",
        hook="capture:around_mrv2_setup",
        feature="runner_mrv2",
    ),
    # Model Runner V2 imports the function by name: its own binding is patched too.
    Point("vllm.v1.worker.gpu.model_runner", "set_eagle3_aux_hidden_state_layers", "AROUND", "capture:around_mrv2_setup", "runner_mrv2"),
    # the speculators-format reader: the raw config.json of a speculators checkpoint
    Point(
        module="vllm.transformers_utils.configs.speculators.base",
        qualname="SpeculatorsConfig.extract_transformers_pre_trained_config",
        kind="AFTER",
        hook="draft:after_speculators_reader",
        feature="speculators_config",
    ),
    # accepted drafts per position: host ints the scheduler already has
    Point("vllm.v1.spec_decode.metrics", "SpecDecodingStats.observe_draft", "AFTER", "acceptance:after_observe_draft", "acceptance"),
    # each count's request sampling: the host SamplingParams of the request it is made for
    Point(
        "vllm.v1.core.sched.scheduler",
        "Scheduler.make_spec_decoding_stats",
        "BEFORE",
        "acceptance:before_spec_stats",
        "acceptance_sampling",
    ),
    # a finished request's output, for how much it loops (acceptance_workload)
    Point("vllm.v1.core.sched.scheduler", "Scheduler._free_request", "BEFORE", "acceptance:before_free_request", "acceptance_workload"),
    # shutdown: the held records are written and the trace closed before vLLM ends the process
    Point("vllm.v1.engine.core", "EngineCore.shutdown", "BEFORE", "lifecycle:before_engine_shutdown", "close_engine_core"),
    Point("vllm.v1.executor.multiproc_executor", "WorkerProc.shutdown", "BEFORE", "lifecycle:before_worker_shutdown", "close_worker"),
)

TABLE = PointTable(POINTS, on_import=f"{_PKG}.patching:patch_module")
MODULES: tuple[str, ...] = TABLE.modules  # every module with a point, in table order
import_targets = TABLE.import_targets  # the import hooks this integration registers
