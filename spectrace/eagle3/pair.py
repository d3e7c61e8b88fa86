"""The trained tiny target/draft pair the demo, tests and detectors run on.

A random-weight tiny target decodes into short loops, and a draft can then guess from
token ids alone, so wiring bugs stop moving acceptance. Here the target is trained for
seconds on a language whose next token is only knowable in context (each sequence
follows its own successor map): continuing it is a two-step lookup that a one-layer
draft can do only through the target's states at earlier positions. Acceptance then
really depends on the fused features: fc bypass and a shifted capture drop it to ~1.1.

The draft is trained, SpecForge-style, on ``cat(hs[0], hs[2], hs[4])`` (SpecForge ids
``[-1, 1, 3]``) to predict the target's greedy tokens, unrolled over 4 steps the way
serving chains them. A second draft, the first fine-tuned with
``norm_before_residual=True`` (speculators' default), serves the scenario where the
engine ignores that flag.

Weights ship in ``data/`` (float16) and are rebuilt by::

    python -m spectrace.eagle3.pair --train

    >>> tensors, config = load_draft_checkpoint()
    >>> config["trained_aux_boundaries"]
    [0, 2, 4]
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .conventions import trainer_boundaries
from .draft import DraftConfig, Eagle3Draft

DATA_DIR = Path(__file__).resolve().parent / "data"

VOCAB = 128
HIDDEN = 64
NUM_LAYERS = 6
TARGET_INTERMEDIATE = 96
DRAFT_VOCAB = 64
DRAFT_INTERMEDIATE = 96
SEQ_LEN = 64

TRAINER_CONVENTION = "specforge"
TRAINED_IDS = [-1, 1, 3]  # SpecForge ids: -1 = embedding output, k = output of block k
TRAINED_BOUNDARIES = trainer_boundaries(TRAINED_IDS, TRAINER_CONVENTION)  # [0, 2, 4]
TRAIN_STEPS_K = 4  # draft steps unrolled in training = the demo's k

DEMO_MAX_NEW_TOKENS = 40
DEMO_PROMPTS = 6
DEMO_PROMPT_LEN = 24


# ----------------------------------------------------------------------------- language


@dataclass
class Language:
    """Per-sequence successor maps: each sequence draws a few hot tokens and a random
    permutation of them, then mostly follows it (``x -> perm[x]``) with random jumps.

    The next token is only knowable *in context* (what followed this token earlier), a
    two-step lookup a one-layer draft cannot do from token ids alone: it needs the
    target's states, whose embedding chunk says which token sat at each earlier position.
    """

    hot: torch.Tensor  # (H,) sorted ids the sequences use; the rest never appear
    vocab: int = VOCAB
    active: int = 16  # tokens per sequence
    follow: float = 0.8  # probability of following the map instead of jumping


def make_language(vocab: int = VOCAB, hot: int = DRAFT_VOCAB, seed: int = 0) -> Language:
    """A language over a random (non-contiguous) hot set, so ``d2t`` is not the identity."""
    gen = torch.Generator().manual_seed(seed)
    hot_ids = torch.randperm(vocab, generator=gen)[:hot].sort().values
    return Language(hot=hot_ids, vocab=vocab)


def sample_language(lang: Language, n: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """``n`` sequences of ``length`` tokens, (n, length) int64."""
    seqs = torch.empty(n, length, dtype=torch.long)
    for row in range(n):
        tokens = lang.hot[torch.randperm(lang.hot.numel(), generator=gen)[: lang.active]]
        succ = dict(zip(tokens.tolist(), tokens[torch.randperm(lang.active, generator=gen)].tolist()))
        jumps = torch.rand(length, generator=gen) > lang.follow
        picks = tokens[torch.randint(0, lang.active, (length,), generator=gen)].tolist()
        cur = picks[0]
        seq = [cur]
        for t in range(1, length):
            cur = picks[t] if jumps[t] else succ[cur]
            seq.append(cur)
        seqs[row] = torch.tensor(seq)
    return seqs


# ----------------------------------------------------------------------------- target


def target_config_dict() -> dict[str, Any]:
    """The tiny target's config.json."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "intermediate_size": TARGET_INTERMEDIATE,
        "num_hidden_layers": NUM_LAYERS,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
        "hidden_act": "silu",
    }


def build_target_model(config: dict[str, Any] | None = None) -> nn.Module:
    """A fresh ``LlamaForCausalLM`` from the tiny config (random weights)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = dict(config or target_config_dict())
    cfg.pop("architectures", None)
    cfg.pop("model_type", None)
    llama = LlamaConfig(**cfg)
    llama._attn_implementation = "sdpa"
    return LlamaForCausalLM(llama)


def train_target(
    lang: Language, steps: int = 450, batch: int = 24, seq_len: int = SEQ_LEN, seed: int = 0, log: bool = True
) -> nn.Module:
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


# ----------------------------------------------------------------------------- draft


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


def speculators_checkpoint(specforge: dict[str, torch.Tensor], embed: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """The same weights as speculators 0.9 saves them: ``layers.0.*``, plus ``embed_tokens``."""
    out = {name.replace("midlayer.", "layers.0."): t for name, t in specforge.items()}
    if embed is not None:
        out["embed_tokens.weight"] = embed.detach().clone()
    return out


# ----------------------------------------------------------------------------- shipped files


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
    draft_ckpt = train_draft(
        target_model, lang, steps=plan.draft_steps, batch=plan.draft_batch, seq_len=plan.seq_len, seed=seed, log=log
    )
    nbr_ckpt = train_draft(
        target_model, lang, norm_before_residual=True, steps=plan.nbr_steps, batch=plan.draft_batch,
        seq_len=plan.seq_len, seed=seed + 1, init_from=draft_ckpt, log=log,
    )
    elapsed = time.perf_counter() - started

    # The state dict without lm_head, which is tied to embed_tokens.
    target_tensors = {
        name: t.detach().half().contiguous()
        for name, t in target_model.state_dict().items()
        if name != "lm_head.weight"
    }
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


def clear_caches() -> None:
    """Forget files read from disk (after retraining)."""
    _target_state.cache_clear()
    _read_draft.cache_clear()
    _demo.cache_clear()


@functools.lru_cache(maxsize=4)
def _target_state(data_dir: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    config = json.loads((data_dir / "target_config.json").read_text())
    return config, load_file(str(data_dir / "target.safetensors"))


def load_target_model(data_dir: Path = DATA_DIR) -> nn.Module:
    """A new ``LlamaForCausalLM`` holding the shipped trained weights (float32).

        >>> load_target_model().config.num_hidden_layers
        6
    """
    config, tensors = _target_state(Path(data_dir))
    model = build_target_model(config)
    state = {name: t.float() for name, t in tensors.items()}
    model.load_state_dict(state, strict=False)  # lm_head is tied to embed_tokens
    model.tie_weights()
    return model.eval()


@functools.lru_cache(maxsize=8)
def _read_draft(data_dir: Path, norm_before_residual: bool) -> tuple[dict[str, torch.Tensor], str]:
    from safetensors.torch import load_file

    stem = "draft_nbr" if norm_before_residual else "draft"
    tensors = load_file(str(data_dir / f"{stem}.safetensors"))
    return tensors, (data_dir / f"{stem}_config.json").read_text()


def load_draft_checkpoint(
    norm_before_residual: bool = False, data_dir: Path = DATA_DIR
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The shipped SpecForge-named draft tensors (as stored: float16, d2t int64, t2d bool) and its config dict."""
    tensors, config_text = _read_draft(Path(data_dir), norm_before_residual)
    return dict(tensors), json.loads(config_text)


def as_loadable(tensors: dict[str, torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
    """Checkpoint tensors as ``(name, tensor)`` pairs in float32 (integer and bool kept)."""
    return [(name, t.float() if t.is_floating_point() else t) for name, t in tensors.items()]


def load_draft(
    target_embed: torch.Tensor | None = None,
    engine_version: str = "0.5.23",
    norm_before_residual: bool = False,
    honor_norm_before_residual: bool = False,
    data_dir: Path = DATA_DIR,
) -> Eagle3Draft:
    """A draft built from the shipped config, loaded through ``load_weights``, embedding set from the target.

        >>> draft = load_draft()
        >>> draft.load_report.ignored
        []
    """
    tensors, config = load_draft_checkpoint(norm_before_residual, data_dir)
    draft = Eagle3Draft(DraftConfig.from_dict(config), engine_version, honor_norm_before_residual)
    draft.load_weights(as_loadable(tensors))
    if target_embed is None:
        target_embed = load_target_model(data_dir).get_input_embeddings().weight
    draft.set_embed(target_embed)
    return draft.eval()


@functools.lru_cache(maxsize=4)
def _demo(data_dir: Path) -> str:
    return (data_dir / "demo.json").read_text()


def demo_prompts(data_dir: Path = DATA_DIR) -> list[list[int]]:
    """The demo's prompts: six 24-token sequences sampled from the training language (seed 99).

    Each holds the start of its own successor map, so continuing it needs the in-context
    lookup the draft can only do through the target's states.

        >>> len(demo_prompts()), len(demo_prompts()[0])
        (6, 24)
    """
    return [list(p) for p in json.loads(_demo(Path(data_dir)))["prompts"]]


def demo_max_new_tokens(data_dir: Path = DATA_DIR) -> int:
    """Tokens the demo generates per prompt."""
    return int(json.loads(_demo(Path(data_dir)))["max_new_tokens"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spectrace.eagle3.pair", description=__doc__.split("\n\n")[0])
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
        from .bugs import measure_all

        print(json.dumps(measure_all(data_dir=args.out), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
