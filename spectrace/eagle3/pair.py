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

Weights ship in ``data/`` (float16); this module holds the pair's language, configs and
loaders. The training code is a development script, not part of the package::

    python scripts/train_pair.py --train

    >>> tensors, config = load_draft_checkpoint()
    >>> config["trained_aux_boundaries"]
    [0, 2, 4]
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..rules.conventions import trainer_boundaries
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
    from .target import require_transformers

    require_transformers()
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = dict(config or target_config_dict())
    cfg.pop("architectures", None)
    cfg.pop("model_type", None)
    llama = LlamaConfig(**cfg)
    llama._attn_implementation = "sdpa"
    return LlamaForCausalLM(llama)


# ----------------------------------------------------------------------------- draft


def speculators_checkpoint(specforge: dict[str, torch.Tensor], embed: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """The same weights as speculators 0.9 saves them: ``layers.0.*``, plus ``embed_tokens``."""
    out = {name.replace("midlayer.", "layers.0."): t for name, t in specforge.items()}
    if embed is not None:
        out["embed_tokens.weight"] = embed.detach().clone()
    return out


# ----------------------------------------------------------------------------- shipped files


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


def load_draft_checkpoint(norm_before_residual: bool = False, data_dir: Path = DATA_DIR) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
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
