"""The user's draft and target, shrunk, built and run by vLLM's own code on the CPU.

Each step is the server's, on the engine's objects: ``EngineArgs.create_engine_config``
reads both shrunk config.json files (the draft through vLLM's speculative config, where
speculators-format drafts are converted), vLLM's CPU model runner loads the target (random
weights, the ``dummy`` load format) and its EAGLE-3 proposer loads the draft from a tiny
checkpoint written under the user's own tensor names, shares the target's embedding and
head where vLLM does, and sets the target's aux-layer capture; a prefill then runs both
(``combine_hidden_states`` and the draft's forward). spectrace's vLLM hooks, installed as
under ``SPECTRACE=1``, record and check all of it.
"""

from __future__ import annotations

import copy
import json
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from .engine_common import EngineRunError, fc_in, flag_set, quiet, rotaries, tiny_folders, watch_reads, write_tiny_checkpoint
from .facts import BuiltModel, EngineFacts
from .shrink import shrink_config, width_map

PREFILL_TOKENS = 8
# vLLM's CPU kernels have no head size of 16 and no GEMM over 8 input features: the shrunk
# heads, MLA parts and expert widths are wider there.
HEAD_DIM = 32
_WIDER = {
    "q_lora_rank": 64,
    "kv_lora_rank": 64,
    "qk_rope_head_dim": 32,
    "qk_nope_head_dim": 32,
    "v_head_dim": 32,
    "moe_intermediate_size": 64,
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _setup(vc: Any) -> None:
    """vLLM's parallel state for world size 1 on gloo, once per process; set up again when a
    MoE model finds none for its experts (vLLM makes that group only for a MoE config)."""
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel, parallel_state

    moe = bool(getattr(vc.model_config, "is_moe", False)) or bool(
        getattr(getattr(vc.speculative_config, "draft_model_config", None), "is_moe", False)
    )
    # Whoever came first (the doctor, a test's harness): a second set-up of a group raises.
    with set_current_vllm_config(vc):
        if parallel_state._WORLD is None:
            init_distributed_environment(
                world_size=1, rank=0, distributed_init_method=f"tcp://127.0.0.1:{_free_port()}", local_rank=0, backend="gloo"
            )
        if parallel_state.model_parallel_is_initialized() and moe and parallel_state._EP is None:
            parallel_state.destroy_model_parallel()
        if not parallel_state.model_parallel_is_initialized():
            initialize_model_parallel(1, 1)


def tiny_target_of(folder: Path) -> dict[str, Any]:
    return dict(json.loads((folder / "config.json").read_text()))


def _dtype(config: Mapping[str, Any]) -> str:
    """float32, except for a mixture-of-experts target: vLLM's CPU MoE kernel takes 16-bit weights only."""
    levels = [config, config.get("text_config") or {}]
    moe = any(
        isinstance(level, dict) and any(k in level for k in ("n_routed_experts", "num_experts", "num_local_experts")) for level in levels
    )
    return "bfloat16" if moe else "float32"


def _widen_heads(config: dict[str, Any]) -> dict[str, Any]:
    """The shrunk config with heads of :data:`HEAD_DIM` (vLLM's CPU attention kernels)."""
    for level in (config, config.get("text_config"), config.get("transformer_layer_config")):
        if isinstance(level, dict) and isinstance(level.get("num_attention_heads"), int) and isinstance(level.get("hidden_size"), int):
            level["head_dim"] = HEAD_DIM
            level.update({k: v for k, v in _WIDER.items() if isinstance(level.get(k), int)})
    return config


def run(
    target_config: Mapping[str, Any], draft_config: Mapping[str, Any], tensors: Mapping[str, Any], maps: Any, recorder: Any
) -> EngineFacts:
    """Build and run the shrunk pair on vLLM; records go to ``recorder``."""
    nested = target_config.get("text_config")
    text: Mapping[str, Any] = nested if isinstance(nested, dict) else target_config
    tiny_target = _widen_heads(shrink_config(target_config))
    tiny_draft = _widen_heads(shrink_config(draft_config, target_hidden=text.get("hidden_size")))
    with tiny_folders(tiny_target, tiny_draft) as (tdir, ddir):
        try:
            with quiet() as engine_log:
                facts = _build_and_run(tdir, ddir, tensors, maps, draft_config, tiny_draft, recorder)
        except Exception as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise EngineRunError(f"{type(exc).__name__}: {first}", engine_log) from exc
    return facts


def _build_and_run(
    tdir: Path, ddir: Path, tensors: Mapping[str, Any], maps: Any, draft_config: Mapping[str, Any], tiny_draft: dict[str, Any],
    recorder: Any,
) -> EngineFacts:  # fmt: skip
    from vllm.config import LoadConfig, set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs
    from vllm.forward_context import set_forward_context
    from vllm.model_executor.model_loader.utils import get_model_architecture
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    from ..integrations import vllm as st_vllm
    from ..integrations.vllm import state as st_state
    from ..recorder import Recorder
    from ..rules.readings import SPECULATORS_FLAGS
    from ..settings import Settings

    steps: list[str] = []
    args = EngineArgs(
        model=str(tdir), skip_tokenizer_init=True, dtype=_dtype(tiny_target_of(tdir)), max_model_len=256, enforce_eager=True, load_format="dummy",
        speculative_config={"method": "eagle3", "model": str(ddir), "num_speculative_tokens": 3},
    )  # fmt: skip
    vc = args.create_engine_config()
    draft_mc = vc.speculative_config.draft_model_config
    _setup(vc)
    with set_current_vllm_config(vc):
        runner = CPUModelRunner(vc, torch.device("cpu"))  # also turns torch's accelerator calls into no-ops, as on a server
    # A probe of the draft's class (on a copy of the config: its layers register by name) gives
    # each parameter's tiny shape, for the checkpoint the proposer's loader then reads.
    st_vllm.install(Recorder(Settings.from_env({"SPECTRACE_QUIET": "1"}), directory=None))
    st_state.reset(Recorder(Settings.from_env({"SPECTRACE_QUIET": "1"}), directory=None))
    probe_config = copy.deepcopy(vc)
    cls, _ = get_model_architecture(probe_config.speculative_config.draft_model_config)
    with set_current_vllm_config(probe_config):
        probe = cls(vllm_config=probe_config)
    write_tiny_checkpoint(ddir, tensors, maps, probe, draft_mc.hf_config, width_map(draft_config, tiny_draft))
    del probe, probe_config
    st_state.reset(recorder)
    vc.speculative_config.draft_load_config = LoadConfig(load_format="auto")  # the draft from its (tiny) checkpoint
    flags = set(SPECULATORS_FLAGS)
    log = watch_reads(draft_mc.hf_config, flags)
    with set_current_vllm_config(vc):
        runner.load_model()
    target, draft = runner.model, runner.drafter.model
    steps.append(f"target: {vc.model_config.architectures} -> {type(target).__name__} (dummy weights)")
    steps.append(f"draft: {draft_mc.hf_config.architectures} -> {type(draft).__name__}")
    inner = getattr(target, "model", target)
    layers = getattr(inner, "aux_hidden_state_layers", None)

    g = torch.Generator().manual_seed(1)
    vocab = int(getattr(vc.model_config.hf_text_config, "vocab_size", 0) or 128)
    ids = torch.randint(0, vocab, (PREFILL_TOKENS,), generator=g)
    positions = torch.arange(PREFILL_TOKENS)
    width = None
    with set_current_vllm_config(vc), set_forward_context(None, vc), torch.no_grad():
        out = target(ids, positions)
        if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], (list, tuple)):
            fused = torch.cat(list(out[1]), dim=-1)
        else:
            fused = out[0] if isinstance(out, tuple) else out
        width = int(fused.shape[-1])
        hidden = draft.combine_hidden_states(fused)
        draft_out = draft(ids, positions, hidden)
        draft.compute_logits(draft_out[0] if isinstance(draft_out, tuple) else draft_out)
    steps.append(f"forward: prefill {PREFILL_TOKENS} tokens")
    d2t = getattr(draft, "draft_id_to_target_id", None)
    hot = (d2t.detach() + torch.arange(d2t.numel())) if d2t is not None else None
    shared = getattr(getattr(draft, "model", None), "embed_tokens", None) is getattr(inner, "embed_tokens", object())
    import vllm

    # vLLM's CPU build repacks each linear weight for its CPU GEMM after the load (a GPU server
    # does not): the replaced-weights check would take that for an engine step swapping them.
    repacked = sorted(f"{name}.weight" for name, module in draft.named_modules() if hasattr(module, "cpu_linear"))
    notes = (
        ["vLLM's CPU build repacked the draft's linear weights after the load; they are left out of weights_replaced_after_load"]
        if repacked
        else []
    )
    return EngineFacts(
        engine="vllm",
        engine_version=str(getattr(vllm, "__version__", "unknown")),
        target=BuiltModel(architectures=list(vc.model_config.architectures or []), cls=type(target).__name__, rotaries=rotaries(target)),
        draft=BuiltModel(
            architectures=list(draft_mc.hf_config.architectures or []),
            cls=type(draft).__name__,
            rotaries=rotaries(draft),
            config_architectures=list(tiny_draft.get("architectures") or []),
        ),  # fmt: skip
        capture_ids=[int(i) for i in layers] if layers is not None else None,
        fused_width=width,
        fc_in_features=fc_in(draft),
        tiny_hidden=int(vc.model_config.hf_text_config.hidden_size),
        flags_set=sorted(k for k in flags if flag_set(tiny_draft, k)),
        flags_read=sorted(log.read),
        hot_token_ids=[int(v) for v in hot.tolist()[:8]] if hot is not None else None,
        hot_token_count=int(hot.numel()) if hot is not None else None,
        embed_head="_maybe_share_embeddings" if shared else None,
        cpu_repacked=repacked,
        steps=steps,
        notes=notes,
    )
