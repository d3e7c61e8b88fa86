"""Train spectrace's tiny target/draft pair and write ``spectrace/eagle3/data/`` (development
only: the package ships the weights and loads them, it never trains).

    python scripts/train_pair.py --train            # ~60 s on 2 CPU cores
    python scripts/train_pair.py --check            # every demo scenario's accept length

What the pair is and why it is trained this way: ``spectrace/eagle3/pair.py``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's spectrace

from spectrace.eagle3.draft import DraftConfig, Eagle3Draft  # noqa: E402
from spectrace.eagle3.pair import (  # noqa: E402
    DATA_DIR,
    DEMO_MAX_NEW_TOKENS,
    DEMO_PROMPT_LEN,
    DEMO_PROMPTS,
    DRAFT_INTERMEDIATE,
    DRAFT_VOCAB,
    HIDDEN,
    SEQ_LEN,
    TRAIN_STEPS_K,
    TRAINED_BOUNDARIES,
    TRAINED_IDS,
    TRAINER_CONVENTION,
    VOCAB,
    Language,
    build_target_model,
    clear_caches,
    make_language,
    sample_language,
    target_config_dict,
)


def train_target(lang: Language, steps: int = 450, batch: int = 24, seq_len: int = SEQ_LEN, seed: int = 0, log: bool = True) -> nn.Module:
    """Next-token training on the synthetic language, then rounded to float16 (what ships)."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed + 1)
    model = build_target_model()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    for step in range(steps):
        lr = 3e-3 * min(1.0, (step + 1) / 50) * 0.5 * (1 + math.cos(math.pi * step / steps))
        for group in opt.param_groups:
            group["lr"] = lr
        ids = sample_language(lang, batch, seq_len, gen)
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if log and (step % 50 == 0 or step == steps - 1):
            print(f"target step {step:4d} loss {loss.item():.3f}")
    model.eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.half().float())
    return model


def draft_config_dict(norm_before_residual: bool = False) -> dict[str, Any]:
    """The draft's config.json, SpecForge style, with the training provenance recorded."""
    config: dict[str, Any] = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "vocab_size": VOCAB,
        "draft_vocab_size": DRAFT_VOCAB,
        "hidden_size": HIDDEN,
        "target_hidden_size": HIDDEN,
        "intermediate_size": DRAFT_INTERMEDIATE,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(TRAINED_IDS), "use_aux_hidden_state": True},
        # Provenance: what the draft was really trained on, in canonical boundaries.
        "trainer_convention": TRAINER_CONVENTION,
        "trained_aux_layer_ids": list(TRAINED_IDS),
        "trained_aux_boundaries": list(TRAINED_BOUNDARIES),
    }
    if norm_before_residual:
        config["norm_before_residual"] = True
    return config


def _features(model: nn.Module, ids: torch.Tensor, boundaries: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, L, 3h) fused states at ``boundaries`` and (B, L) target greedy choices."""
    with torch.no_grad():
        out = model.model(input_ids=ids, output_hidden_states=True, use_cache=False)
        feats = torch.cat([out.hidden_states[b] for b in boundaries], dim=-1)
        choice = model.lm_head(out.last_hidden_state).argmax(-1)
    return feats, choice


def _unroll_mask(slots: int, step: int) -> torch.Tensor:
    """Keys for step ``step``: step-1 keys causally, then each later step's key at the same slot.

    This is serving's view: a chain started after slot p sees the prefix (step-1 inputs
    up to p) and its own earlier proposals, nothing else.
    """
    blocks = [torch.ones(slots, slots, dtype=torch.bool).tril()]
    blocks += [torch.eye(slots, dtype=torch.bool)] * (step - 1)
    return torch.cat(blocks, dim=1)


def unrolled_loss(
    draft: Eagle3Draft, ids: torch.Tensor, feats: torch.Tensor, choice: torch.Tensor, t2d: torch.Tensor, k: int
) -> torch.Tensor:
    """Training-time test over ``k`` steps (EAGLE-3): step j feeds step j-1's own output back."""
    model, layer = draft.model, draft.model.decoder_layer
    slots = ids.shape[1] - k
    total = torch.zeros(())
    hidden = None
    past: tuple[torch.Tensor, torch.Tensor] | None = None
    for j in range(1, k + 1):
        tokens = ids[:, j : j + slots]
        embeds = model.embed_tokens(tokens)
        hidden_in = model.fc(feats[:, :slots]) if j == 1 else hidden
        positions = torch.arange(slots) + (j - 1)
        out, residual, kv = layer(positions, embeds, hidden_in, attn_mask=_unroll_mask(slots, j), past_kv=past)
        hidden = out + residual
        past = kv if past is None else (torch.cat([past[0], kv[0]], dim=2), torch.cat([past[1], kv[1]], dim=2))
        logits = draft.lm_head(model.norm(hidden))
        labels = t2d[choice[:, j : j + slots]]
        total = total + (0.8 ** (j - 1)) * F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)
    return total


def vocab_map(choices: torch.Tensor, vocab: int = VOCAB, draft_vocab: int = DRAFT_VOCAB) -> tuple[torch.Tensor, torch.Tensor]:
    """SpecForge's reduced vocabulary: the most frequent target choices, sorted; returns (d2t, t2d_index)."""
    counts = torch.bincount(choices.reshape(-1), minlength=vocab)
    used = counts.argsort(descending=True, stable=True)[:draft_vocab].sort().values
    d2t = used - torch.arange(draft_vocab)
    t2d_index = torch.full((vocab,), -100, dtype=torch.long)
    t2d_index[used] = torch.arange(draft_vocab)
    return d2t, t2d_index


def train_draft(
    target_model: nn.Module,
    lang: Language,
    norm_before_residual: bool = False,
    steps: int = 250,
    batch: int = 24,
    seq_len: int = SEQ_LEN,
    seed: int = 0,
    init_from: dict[str, torch.Tensor] | None = None,
    log: bool = True,
) -> dict[str, torch.Tensor]:
    """Train a draft on the target's fused states; returns its SpecForge-named checkpoint.

    ``init_from`` (a checkpoint from this function) starts from trained weights: the
    ``norm_before_residual`` draft is the healthy one fine-tuned under that semantics.
    """
    torch.manual_seed(seed + 7)
    gen = torch.Generator().manual_seed(seed + 2)
    corpus = sample_language(lang, 512, seq_len, gen)
    feats, choice = _features(target_model, corpus, TRAINED_BOUNDARIES)
    d2t, t2d_index = vocab_map(choice)
    config = DraftConfig.from_dict(draft_config_dict(norm_before_residual))
    draft = Eagle3Draft(config, honor_norm_before_residual=True, init_seed=seed + 2024)
    if init_from is not None:
        draft.load_weights((n, t.float() if t.is_floating_point() else t) for n, t in init_from.items())
    draft.set_embed(target_model.get_input_embeddings().weight.detach().clone())
    draft.model.embed_tokens.weight.requires_grad_(False)
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=3e-3, weight_decay=0.0)
    for step in range(steps):
        lr = 3e-3 * min(1.0, (step + 1) / 30) * 0.5 * (1 + math.cos(math.pi * step / steps))
        for group in opt.param_groups:
            group["lr"] = lr
        rows = torch.randint(0, corpus.shape[0], (batch,), generator=gen)
        loss = unrolled_loss(draft, corpus[rows], feats[rows], choice[rows], t2d_index, TRAIN_STEPS_K)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if log and (step % 50 == 0 or step == steps - 1):
            print(f"draft{' (norm_before_residual)' if norm_before_residual else ''} step {step:4d} loss {loss.item():.3f}")
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[d2t + torch.arange(DRAFT_VOCAB)] = True
    return specforge_checkpoint(draft, d2t, t2d)


def specforge_checkpoint(draft: Eagle3Draft, d2t: torch.Tensor, t2d: torch.Tensor) -> dict[str, torch.Tensor]:
    """Engine parameters renamed to SpecForge's keys: ``midlayer.*``, separate q/k/v and gate/up."""
    layer = draft.model.decoder_layer
    attn, mlp = layer.self_attn, layer.mlp
    q_rows = attn.num_heads * attn.head_dim
    kv_rows = attn.num_kv_heads * attn.head_dim
    q, k, v = attn.qkv_proj.weight.detach().split([q_rows, kv_rows, kv_rows])
    gate, up = mlp.gate_up_proj.weight.detach().chunk(2)
    tensors = {
        "fc.weight": draft.model.fc.weight,
        "midlayer.input_layernorm.weight": layer.input_layernorm.weight,
        "midlayer.hidden_norm.weight": layer.hidden_norm.weight,
        "midlayer.post_attention_layernorm.weight": layer.post_attention_layernorm.weight,
        "midlayer.self_attn.q_proj.weight": q,
        "midlayer.self_attn.k_proj.weight": k,
        "midlayer.self_attn.v_proj.weight": v,
        "midlayer.self_attn.o_proj.weight": attn.o_proj.weight,
        "midlayer.mlp.gate_proj.weight": gate,
        "midlayer.mlp.up_proj.weight": up,
        "midlayer.mlp.down_proj.weight": mlp.down_proj.weight,
        "norm.weight": draft.model.norm.weight,
        "lm_head.weight": draft.lm_head.weight,
    }
    out = {name: t.detach().clone().half().contiguous() for name, t in tensors.items()}
    out["d2t"] = d2t.long().contiguous()
    out["t2d"] = t2d.contiguous()
    return out


@dataclass
class TrainPlan:
    """Step counts and shapes for :func:`train_all` (defaults fit < 60 s on 2 CPU cores)."""

    target_steps: int = 450
    target_batch: int = 24
    draft_steps: int = 400
    nbr_steps: int = 100
    draft_batch: int = 24
    seq_len: int = SEQ_LEN


def train_all(out_dir: Path = DATA_DIR, seed: int = 0, plan: TrainPlan | None = None, log: bool = True) -> dict[str, Any]:
    """Train the target and both drafts and write them to ``out_dir``; returns timings and sizes."""
    from safetensors.torch import save_file

    plan = plan or TrainPlan()
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    lang = make_language(seed=seed)
    target_model = train_target(lang, plan.target_steps, plan.target_batch, plan.seq_len, seed=seed, log=log)
    target_seconds = time.perf_counter() - started
    draft_ckpt = train_draft(target_model, lang, steps=plan.draft_steps, batch=plan.draft_batch, seq_len=plan.seq_len, seed=seed, log=log)
    nbr_ckpt = train_draft(
        target_model,
        lang,
        norm_before_residual=True,
        steps=plan.nbr_steps,
        batch=plan.draft_batch,
        seq_len=plan.seq_len,
        seed=seed + 1,
        init_from=draft_ckpt,
        log=log,
    )
    elapsed = time.perf_counter() - started

    # The state dict without lm_head, which is tied to embed_tokens.
    target_tensors = {name: t.detach().half().contiguous() for name, t in target_model.state_dict().items() if name != "lm_head.weight"}
    save_file(target_tensors, str(out_dir / "target.safetensors"))
    (out_dir / "target_config.json").write_text(json.dumps(target_config_dict(), indent=2) + "\n")
    save_file(draft_ckpt, str(out_dir / "draft.safetensors"))
    (out_dir / "draft_config.json").write_text(json.dumps(draft_config_dict(), indent=2) + "\n")
    save_file(nbr_ckpt, str(out_dir / "draft_nbr.safetensors"))
    (out_dir / "draft_nbr_config.json").write_text(json.dumps(draft_config_dict(True), indent=2) + "\n")
    gen = torch.Generator().manual_seed(seed + 99)
    prompts = sample_language(lang, DEMO_PROMPTS, DEMO_PROMPT_LEN, gen).tolist()
    demo = {"prompts": prompts, "max_new_tokens": DEMO_MAX_NEW_TOKENS, "k": TRAIN_STEPS_K, "seed": seed}
    (out_dir / "demo.json").write_text(json.dumps(demo) + "\n")
    clear_caches()
    size = sum(p.stat().st_size for p in out_dir.glob("*.safetensors"))
    report = {
        "train_seconds": round(elapsed, 1),
        "target_seconds": round(target_seconds, 1),
        "weights_bytes": size,
        "torch_threads": torch.get_num_threads(),
    }
    if log:
        print(json.dumps(report))
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/train_pair.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--train", action="store_true", help="train the pair and write spectrace/eagle3/data/")
    parser.add_argument("--out", type=Path, default=DATA_DIR, help="output folder (default: the package's data/)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    parser.add_argument("--check", action="store_true", help="after training, print every scenario's accept length")
    args = parser.parse_args(argv)
    if not (args.train or args.check):
        parser.print_help()
        return 0
    torch.set_num_threads(args.threads)
    if args.train:
        train_all(args.out, seed=args.seed)
    if args.check:
        from spectrace.eagle3.bugs import measure_all

        print(json.dumps(measure_all(data_dir=args.out), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
