"""Where spectrace hooks SGLang: one row per patch point, for every route in.

A point names a dotted target (``module.Class.method``), the HookRegistry hook type and
the hook (written with HookRegistry's signatures, so the plugin route and the import-hook
route run the very same function). Points of one ``feature`` are alternatives across
SGLang versions: a feature is reported "not covered" only when none of them exists.
Line numbers and semantics: docs/sglang-patch-points.md.
"""

from __future__ import annotations

from ..core.points import Point as _CorePoint
from ..core.points import PointTable

_PKG = "spectrace.integrations.sglang"


class Point(_CorePoint):
    """A patch point whose hook lives in this package."""

    package = _PKG


M = "sglang.srt.models"
S = "sglang.srt.speculative"
B = "sglang.srt.model_executor.runner_backend"
POINTS: tuple[Point, ...] = (
    # draft weights (bug 2)
    Point(f"{M}.llama_eagle3", "LlamaForCausalLMEagle3.load_weights", "AROUND", "weights:around_draft_load", "draft_load_weights"),
    Point(f"{M}.llama_eagle3", "LlamaForCausalLMEagle3.__init__", "AFTER", "weights:after_draft_init", "draft_present"),
    Point(
        f"{M}.kimi_k25_eagle3", "Eagle3DeepseekV2ForCausalLM.load_weights", "AROUND", "weights:around_draft_load", "mla_draft_load_weights"
    ),
    Point(f"{M}.kimi_k25_eagle3", "Eagle3DeepseekV2ForCausalLM.__init__", "AFTER", "weights:after_draft_init", "mla_draft_present"),
    # draft input width (bug 1)
    Point(f"{M}.llama_eagle3", "LlamaModel.forward", "AROUND", "forward:around_draft_forward", "draft_fc_input"),
    Point(f"{M}.kimi_k25_eagle3", "Eagle3MLAModel.forward", "AROUND", "forward:around_draft_forward", "mla_draft_fc_input"),
    # target capture list (bug 3); DeepseekV3 inherits the V2 method, Kimi delegates to it
    Point(f"{M}.llama", "LlamaForCausalLM.set_eagle3_layers_to_capture", "AFTER", "capture:after_set_capture", "llama_capture"),
    Point(
        f"{M}.deepseek_v2", "DeepseekV2ForCausalLM.set_eagle3_layers_to_capture", "AFTER", "capture:after_set_capture", "deepseek_capture"
    ),
    Point(
        f"{M}.kimi_k25",
        "KimiK25ForConditionalGeneration.set_eagle3_layers_to_capture",
        "AROUND",
        "capture:around_wrapper_capture",
        "kimi_capture",
    ),
    # every other EAGLE-3 target of 0.5.17 and 0.5.23 (rules.conventions.SGLANG_TARGET_FAMILIES);
    # AROUND, so a class that reaches another patched one through super() or its language
    # model is recorded once. Alternatives: a release without one of them misses only it.
    *(
        Point(f"{M}.{module}", f"{cls}.set_eagle3_layers_to_capture", "AROUND", "capture:around_wrapper_capture", "family_capture")
        for module, cls in (
            ("apertus", "ApertusForCausalLM"),
            ("bailing_moe", "BailingMoEForCausalLM"),
            ("exaone_moe", "ExaoneMoEForCausalLM"),
            ("gemma3_causal", "Gemma3ForCausalLM"),
            ("gemma3_mm", "Gemma3ForConditionalGeneration"),
            ("gemma4_causal", "Gemma4ForCausalLM"),
            ("gemma4_mm", "Gemma4ForConditionalGeneration"),
            ("glm4_moe", "Glm4MoeForCausalLM"),
            ("glm4_moe_lite", "Glm4MoeLiteForCausalLM"),
            ("glm5_next", "Glm5NextForConditionalGeneration"),
            ("gpt_oss", "GptOssForCausalLM"),
            ("longcat_flash", "LongcatFlashForCausalLM"),
            ("mindspore", "MindSporeForCausalLM"),
            ("minimax_m2", "MiniMaxM2ForCausalLM"),
            ("minimax_m3", "MiniMaxM3SparseForCausalLM"),
            ("minimax_m3_vl", "MiniMaxM3SparseForConditionalGeneration"),
            ("mllama4", "Llama4ForConditionalGeneration"),
            ("qwen2", "Qwen2ForCausalLM"),
            ("qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration"),
            ("qwen2_moe", "Qwen2MoeForCausalLM"),
            ("qwen3", "Qwen3ForCausalLM"),
            ("qwen3_5_text", "Qwen3_5ForCausalLM"),
            ("qwen3_moe", "Qwen3MoeForCausalLM"),
            ("qwen3_next", "Qwen3NextForCausalLM"),
            ("qwen3_vl", "Qwen3VLForConditionalGeneration"),
        )
    ),  # fmt: skip
    # silent fallback to the final hidden state
    Point(
        "sglang.srt.layers.logits_processor",
        "LogitsProcessor._get_hidden_states_to_store",
        "AFTER",
        "forward:after_hidden_to_store",
        "logits_fallback",
    ),
    # accept lengths (CPU lists)
    Point(f"{S}.eagle_worker_v2", "EAGLEWorkerV2.on_verify_complete_cpu", "AFTER", "acceptance:after_verify_complete_cpu", "acceptance"),
    # The verified requests' sampling (host-side values only), paired with the accept lengths.
    Point(f"{S}.eagle_worker_v2", "EAGLEWorkerV2.verify", "BEFORE", "acceptance:before_verify", "acceptance_sampling"),
    Point(f"{S}.eagle_worker", "EAGLEWorker.verify", "AFTER", "acceptance:after_v1_verify", "acceptance"),
    # CUDA graphs: replay coverage, stale draft-extend input. Where the runners replay through
    # runner_backend (0.5.17+), each captured graph's graph_stats.ReplayGate counts its replays, so
    # the runner-level counting hooks are only the fallback for older versions.
    Point(
        "sglang.srt.model_executor.runner.decode_cuda_graph_runner",
        "DecodeCudaGraphRunner.execute",
        "AFTER",
        "graphs:after_execute",
        "graph_replay",
        unless=f"{B}.full_cuda_graph_backend",
    ),
    Point(
        "sglang.srt.model_executor.cuda_graph_runner",
        "CudaGraphRunner.replay",
        "AFTER",
        "graphs:after_execute",
        "graph_replay",
        unless=f"{B}.full_cuda_graph_backend",
    ),
    Point(
        f"{S}.eagle_draft_cuda_graph_runner",
        "EAGLEDraftCudaGraphRunner.execute",
        "AFTER",
        "graphs:after_execute",
        "draft_graph_replay",
        unless=f"{B}.full_cuda_graph_backend",
    ),
    Point(
        f"{S}.eagle_draft_cuda_graph_runner",
        "EAGLEDraftCudaGraphRunner.replay",
        "AFTER",
        "graphs:after_execute",
        "draft_graph_replay",
        unless=f"{B}.full_cuda_graph_backend",
    ),
    Point(
        f"{S}.eagle_draft_extend_cuda_graph_runner",
        "EAGLEDraftExtendCudaGraphRunner.execute",
        "BEFORE",
        "graphs:before_draft_extend_execute",
        "draft_extend_stale_input",
    ),
    Point(
        f"{S}.eagle_draft_extend_cuda_graph_runner",
        "EAGLEDraftExtendCudaGraphRunner.execute",
        "AFTER",
        "graphs:after_execute",
        "draft_extend_graph_replay",
        unless=f"{B}.full_cuda_graph_backend",
    ),
    # per-module records (the tracing engine on SGLang's own model objects)
    Point(f"{M}.llama", "LlamaForCausalLM.__init__", "AFTER", "modules:after_model_init", "modules_llama"),
    Point(f"{M}.llama_eagle3", "LlamaForCausalLMEagle3.__init__", "AFTER", "modules:after_model_init", "modules_llama_draft"),
    Point(f"{M}.deepseek_v2", "DeepseekV2ForCausalLM.__init__", "AFTER", "modules:after_model_init", "modules_deepseek"),
    Point(f"{M}.kimi_k25", "KimiK25ForConditionalGeneration.__init__", "AFTER", "modules:after_model_init", "modules_kimi"),
    Point(f"{M}.kimi_k25_eagle3", "Eagle3DeepseekV2ForCausalLM.__init__", "AFTER", "modules:after_model_init", "modules_kimi_draft"),
    Point("sglang.srt.model_executor.model_runner", "ModelRunner.load_model", "AFTER", "modules:after_load_model", "modules_runner"),
    Point("sglang.srt.layers.logits_processor", "LogitsProcessor._compute_lm_head", "AFTER", "modules:after_compute_lm_head", "logits"),
    Point(
        "sglang.srt.layers.logits_processor",
        "LogitsProcessor._get_hidden_states_to_store",
        "AFTER",
        "modules:after_hidden_to_store",
        "aux_concat",
    ),
    Point(f"{S}.eagle_worker_v2", "EagleDraftWorker.draft_forward", "AROUND", "modules:around_draft_forward", "draft_steps"),
    # statistics inside captured CUDA graphs (every runner captures and replays through its backend)
    Point(f"{B}.full_cuda_graph_backend", "FullCudaGraphBackend.__init__", "AFTER", "graph_stats:after_backend_init", "graph_stats"),
    Point(f"{B}.full_cuda_graph_backend", "FullCudaGraphBackend.capture_one", "AROUND", "graph_stats:around_capture_one", "graph_stats"),
    Point(
        f"{B}.tc_piecewise_cuda_graph_backend",
        "TcPiecewiseCudaGraphBackend.replay",
        "AFTER",
        "graph_stats:after_unsupported_replay",
        "graph_stats_piecewise",
    ),
    Point(
        f"{B}.breakable_cuda_graph_backend",
        "BreakableCudaGraphBackend.replay",
        "AFTER",
        "graph_stats:after_unsupported_replay",
        "graph_stats_breakable",
    ),
    # rank for the trace file name
    Point("sglang.srt.runtime_context", "publish", "AFTER", "rank:after_publish", "rank"),
    Point("sglang.srt.managers.scheduler", "Scheduler.__init__", "BEFORE", "rank:before_scheduler_init", "rank"),
)

TABLE = PointTable(POINTS, on_import=f"{_PKG}.patching:patch_module")
MODULES: tuple[str, ...] = TABLE.modules  # every module with a point, in table order
import_targets = TABLE.import_targets  # the import hooks this integration registers
