"""The user's draft and target, shrunk, built and run by SGLang's own code on the CPU.

Each step is the server's, on the engine's objects: ``ModelConfig`` reads each shrunk
config.json (the draft in draft mode, where SGLang renames some architectures), the
model loader picks the class and builds it (the target with random weights, SGLang's
``dummy`` load format; the draft from a tiny checkpoint written under the user's own
tensor names), ``resolve_spec_aux_hidden_state_config`` and
``configure_aux_hidden_state_capture`` decide and set the layers the target captures,
``resolve_target_embed_and_head`` gives the draft the target's embedding (and head), and
a prefill and decode steps run both. spectrace's SGLang hooks, installed as under
``SPECTRACE=1``, record and check all of it; :func:`run` returns the records and the
facts read off the built objects.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from . import sglang_cpu as cpu
from .engine_common import EngineRunError, fc_in, flag_set, quiet, rotaries, tiny_folders, watch_reads, write_tiny_checkpoint
from .facts import BuiltModel, EngineFacts
from .shrink import shrink_config, width_map

PREFILL_TOKENS = 8
DECODE_STEPS = 2


# ------------------------------------------------------------------ the run
def _runner(model: Any, config: Any, draft: bool) -> Any:
    """What spectrace's ``ModelRunner.load_model`` hook reads of the runner that built ``model``."""
    return types.SimpleNamespace(model=model, model_config=config, is_draft_worker=draft, server_args=None)


def _init_lm_head(draft: Any, target: Any) -> str | None:
    """The EAGLE-3 branch of ``EAGLEWorkerV2.init_lm_head``, on the engine's own functions (the
    worker's module imports the scheduler chain, which a CPU build lacks)."""
    from sglang.srt.speculative.pp_draft_embedding import resolve_target_embed_and_head

    if not hasattr(draft, "set_embed"):
        return None
    embed, head = resolve_target_embed_and_head(target, draft_model=draft)
    if getattr(draft, "load_lm_head_from_target", False):
        draft.set_embed_and_head(embed, head)
        return "set_embed_and_head"
    draft.set_embed(embed)
    return "set_embed"


def _forward(target: Any, draft: Any, vocab: int) -> tuple[int | None, list[str]]:
    """A prefill and decode steps of the pair, as the EAGLE-3 worker chains them: the target's
    captured states feed the draft. Returns the fused width the target handed over."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    notes: list[str] = []
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (PREFILL_TOKENS,), generator=g)
    fb, backend = cpu.make_extend_batch(ids)
    out = cpu.forward(target, fb, backend)
    hidden = out.hidden_states
    width = int(hidden.shape[-1]) if hidden is not None else None
    shifted = torch.cat([ids[1:], out.next_token_logits.argmax(-1).view(-1)[:1]])
    dfb, dbackend = cpu.make_extend_batch(shifted, hidden_states=hidden)
    cpu.forward(draft, dfb, dbackend)
    seen = ids.tolist()
    for step in range(DECODE_STEPS):
        nxt = torch.randint(0, vocab, (1,), generator=g)
        seen.append(int(nxt))
        try:
            fb, backend = cpu.make_extend_batch(nxt, backend=backend, prefix_lens=[len(seen) - 1], forward_mode=ForwardMode.DECODE)
            out = cpu.forward(target, fb, backend)
        except Exception as exc:  # noqa: BLE001 - a decode path the CPU backend lacks: the prefill still stands
            notes.append(f"decode step {step + 1} of the target did not run on the CPU ({type(exc).__name__}: {str(exc)[:120]})")
            break
        if out.hidden_states is not None:
            dfb, dbackend = cpu.make_extend_batch(nxt, backend=dbackend, prefix_lens=[len(seen) - 1], hidden_states=out.hidden_states[-1:])
            cpu.forward(draft, dfb, dbackend)
    return width, notes


def run(
    target_config: Mapping[str, Any], draft_config: Mapping[str, Any], tensors: Mapping[str, Any], maps: Any, recorder: Any
) -> EngineFacts:
    """Build and run the shrunk pair on SGLang; records go to ``recorder``. The facts returned
    are read off the engine's objects (the records carry the rest)."""
    from ..integrations import sglang as st_sglang
    from ..integrations.sglang import state as st_state
    from ..rules.readings import SPECULATORS_FLAGS

    with quiet():
        cpu.setup()
    from sglang.srt.server_args import ServerArgs

    nested = target_config.get("text_config")
    text: Mapping[str, Any] = nested if isinstance(nested, dict) else target_config
    tiny_target = shrink_config(target_config)
    tiny_draft = shrink_config(draft_config, target_hidden=text.get("hidden_size"))
    with tiny_folders(tiny_target, tiny_draft) as (tdir, ddir):
        try:
            with quiet() as engine_log:
                server_args = ServerArgs(
                    model_path=str(tdir), speculative_algorithm="EAGLE3", speculative_draft_model_path=str(ddir),
                    device="cpu", dtype="float32", tp_size=1,
                )  # fmt: skip
                cpu.publish_server(server_args)
                st_sglang.install(recorder)
                st_state.reset(recorder)
                flags = set(SPECULATORS_FLAGS) | {"use_aux_norm"}
                facts = _build_and_run(tdir, ddir, tensors, maps, draft_config, tiny_draft, server_args, recorder, flags)
        except Exception as exc:
            raise EngineRunError(
                f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}", engine_log
            ) from exc
        finally:
            cpu.publish_server(None)
    return facts


def _build_and_run(
    tdir: Path,
    ddir: Path,
    tensors: Mapping[str, Any],
    maps: Any,
    draft_config: Mapping[str, Any],
    tiny_draft: dict[str, Any],
    server_args: Any,
    recorder: Any,
    flags: set[str],
) -> EngineFacts:
    from sglang.srt.configs.device_config import DeviceConfig
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_executor.model_runner_components.attention_backend_setup import configure_aux_hidden_state_capture
    from sglang.srt.model_executor.model_runner_components.spec_aux_hidden_state import resolve_spec_aux_hidden_state_config
    from sglang.srt.model_loader import get_model
    from sglang.srt.model_loader.utils import get_model_architecture
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from ..integrations.sglang import modules as st_modules
    from ..integrations.sglang import state as st_state
    from ..recorder import Recorder
    from ..settings import Settings

    device = DeviceConfig("cpu")

    steps: list[str] = []
    # A probe of the draft's class gives each parameter's tiny shape, for the checkpoint the
    # loader then reads. Built first, under a state of its own: nothing of it is recorded.
    st_state.reset(Recorder(Settings.from_env({"SPECTRACE_QUIET": "1"}), directory=None))
    probe_mc = ModelConfig(str(ddir), is_draft_model=True, dtype="float32")
    cls, _ = get_model_architecture(probe_mc)
    probe = cls(probe_mc.hf_config)
    write_tiny_checkpoint(ddir, tensors, maps, probe, probe_mc.hf_config, width_map(draft_config, tiny_draft))
    del probe
    st_state.reset(recorder)
    # The per-module records keep shapes only: statistics of random weights say nothing (the
    # value checks, chunk provenance and feature skew, need the user's trained weights).
    st_state.tracer().stats_mode = recorder.settings.stats
    target_mc = ModelConfig(str(tdir), dtype="float32")
    target = get_model(model_config=target_mc, load_config=LoadConfig(load_format="dummy"), device_config=device)
    steps.append(f"target: ModelConfig -> {target_mc.hf_config.architectures} -> {type(target).__name__} (dummy weights)")
    st_modules.after_load_model(None, _runner(target, target_mc, False))

    algorithm = SpeculativeAlgorithm.from_string("EAGLE3")
    aux = resolve_spec_aux_hidden_state_config(
        server_args=server_args, model_config=target_mc, spec_algorithm=algorithm, is_draft_worker=False
    )
    configure_aux_hidden_state_capture(
        model=target, eagle_use_aux_hidden_state=aux.eagle_use_aux_hidden_state,
        eagle_aux_hidden_state_layer_ids=aux.eagle_aux_hidden_state_layer_ids,
        dflash_use_aux_hidden_state=False, dflash_target_layer_ids=None, is_dspark=False,
    )  # fmt: skip
    steps.append(f"capture: eagle_aux_hidden_state_layer_ids={aux.eagle_aux_hidden_state_layer_ids} -> set_eagle3_layers_to_capture")

    draft_mc = ModelConfig(str(ddir), is_draft_model=True, dtype="float32")
    log = watch_reads(draft_mc.hf_config, flags)
    draft = get_model(model_config=draft_mc, load_config=LoadConfig(), device_config=device)
    steps.append(f"draft: ModelConfig(is_draft_model) -> {draft_mc.hf_config.architectures} -> {type(draft).__name__}")
    st_modules.after_load_model(None, _runner(draft, draft_mc, True))
    shared = _init_lm_head(draft, target)
    if shared:
        steps.append(f"draft: the worker's init_lm_head -> {shared}")

    vocab = int(getattr(target_mc.hf_text_config, "vocab_size", 0) or 0) or 128
    width, notes = _forward(target, draft, vocab)
    steps.append(f"forward: prefill {PREFILL_TOKENS} tokens, {DECODE_STEPS} decode steps")
    hot = getattr(draft, "hot_token_id", None)
    return EngineFacts(
        engine="sglang",
        engine_version=_version(),
        target=BuiltModel(
            architectures=list(target_mc.hf_config.architectures or []), cls=type(target).__name__, rotaries=rotaries(target)
        ),
        draft=BuiltModel(
            architectures=list(draft_mc.hf_config.architectures or []),
            cls=type(draft).__name__,
            rotaries=rotaries(draft),
            config_architectures=list(tiny_draft.get("architectures") or []),
        ),  # fmt: skip
        capture_ids=list(aux.eagle_aux_hidden_state_layer_ids) if aux.eagle_aux_hidden_state_layer_ids is not None else None,
        fused_width=width,
        fc_in_features=fc_in(draft),
        tiny_hidden=int(target_mc.hf_text_config.hidden_size),
        flags_set=sorted(k for k in flags if flag_set(tiny_draft, k)),
        flags_read=sorted(log.read),
        hot_token_ids=[int(v) for v in hot.tolist()[:8]] if hot is not None else None,
        hot_token_count=int(hot.numel()) if hot is not None else None,
        embed_head=shared,
        steps=steps,
        notes=notes,
    )


def _version() -> str:
    from ..integrations.sglang.server import sglang_version

    return sglang_version() or "unknown"
