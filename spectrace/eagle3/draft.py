"""A pure-torch EAGLE-3 draft with SGLang's ``LlamaForCausalLMEagle3`` structure and names.

What it reproduces on purpose, because each is a silent failure seen in the field:

- ``model.fc`` runs only ``if hidden_states.shape[-1] != embeds.shape[-1]`` (SGLang's
  test), so a 1x-hidden input (no aux capture) skips fc without a word;
- :meth:`Eagle3Draft.load_weights` follows SGLang's loader: ``d2t`` becomes
  ``hot_token_id``, ``t2d`` is skipped, q/k/v and gate/up are stacked into fused
  parameters, the ``model.`` prefix is added when needed, and a name no parameter
  takes is dropped without a log line; ``engine_version="older"`` names the decoder
  layer ``model.midlayer`` and has no ``layers.0`` mapping, so ``layers.0.*`` is lost;
- ``norm_before_residual`` in the config is ignored unless the draft is built with
  ``honor_norm_before_residual=True`` (what speculators' trainer does).

    >>> draft = Eagle3Draft(DraftConfig(vocab_size=128, draft_vocab_size=64))
    >>> out = draft(torch.tensor([5, 6, 7]), torch.randn(3, 3 * 64))
    >>> out.logits.shape
    torch.Size([3, 64])
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

EngineVersion = Literal["0.5.23", "older"]
ENGINE_VERSIONS: tuple[str, ...] = ("0.5.23", "older")


@dataclass
class DraftConfig:
    """The draft's config.json fields that shape the module (a LlamaConfig subset)."""

    vocab_size: int = 128
    draft_vocab_size: int | None = 64
    hidden_size: int = 64
    target_hidden_size: int | None = None
    intermediate_size: int = 96
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    norm_before_residual: bool = False
    tie_word_embeddings: bool = False
    # The whole config.json it was read from, as an engine's model keeps its config: what
    # the module ignores (eagle_config, training flags) still tells a trace what was asked.
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> DraftConfig:
        """Read the module-shaping fields of a config.json dict; other keys are ignored."""
        known = set(cls.__dataclass_fields__) - {"raw"}
        return cls(**{k: v for k, v in config.items() if k in known}, raw=dict(config))

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        del out["raw"]
        return out

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


@dataclass
class LoadReport:
    """What the last ``load_weights`` did. SGLang keeps no such record; nothing reads it aloud."""

    offered: list[str] = field(default_factory=list)
    written: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)


@dataclass
class DraftOutput:
    logits: torch.Tensor  # (T, draft_vocab): scores over *draft* ids
    hidden_states: torch.Tensor  # (T, hidden): pre-norm, fed back as the next step's input
    input_hidden: torch.Tensor  # (T, hidden): what the decoder layer took (after fc, or raw when fc was skipped)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype) * self.weight


def rotary(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Llama rotary embedding (rotate-half) on ``x`` of shape (..., T, head_dim), positions (T,)."""
    dim = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device=positions.device) / dim))
    freqs = positions.float()[:, None] * inv[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    x1, x2 = x[..., : dim // 2], x[..., dim // 2 :]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class StackedLinear(nn.Linear):
    """A fused projection (qkv_proj, gate_up_proj) with SGLang's per-shard weight loader."""

    def __init__(self, in_features: int, shards: dict[Any, int]) -> None:
        super().__init__(in_features, sum(shards.values()), bias=False)
        offsets, start = {}, 0
        for shard_id, rows in shards.items():
            offsets[shard_id] = (start, rows)
            start += rows
        self.shard_offsets = offsets
        self.weight.weight_loader = self._load_shard  # type: ignore[attr-defined]

    def _load_shard(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: Any = None) -> None:
        if shard_id is None:
            default_weight_loader(param, loaded)
            return
        start, rows = self.shard_offsets[shard_id]
        with torch.no_grad():
            param[start : start + rows].copy_(loaded.to(param.dtype))


def default_weight_loader(param: nn.Parameter, loaded: torch.Tensor) -> None:
    """SGLang's default loader: a plain copy (a shape mismatch raises, a dtype is cast)."""
    with torch.no_grad():
        param.copy_(loaded.to(param.dtype))


class DraftAttention(nn.Module):
    """Attention over the 2*hidden input ``cat(embeds_normed, hidden_normed)``."""

    def __init__(self, config: DraftConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.rope_theta = config.rope_theta
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_proj = StackedLinear(2 * config.hidden_size, {"q": q, "k": kv, "v": kv})
        self.o_proj = nn.Linear(q, config.hidden_size, bias=False)

    def forward(
        self,
        positions: torch.Tensor,
        hidden_states: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        past_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Causal attention over ``hidden_states`` ((T, 2h) or (B, T, 2h)); returns output and this call's (k, v).

        ``past_kv`` (keys and values from earlier calls, (B, kv_heads, S, head_dim)) and a
        boolean ``attn_mask`` (T, S + T) serve training-time unrolling; serving leaves
        both None (plain causal attention).
        """
        single = hidden_states.dim() == 2
        x = hidden_states.unsqueeze(0) if single else hidden_states
        B, T, _ = x.shape
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q, k, v = self.qkv_proj(x).split([q_size, kv_size, kv_size], dim=-1)
        q = rotary(q.view(B, T, self.num_heads, self.head_dim).transpose(1, 2), positions, self.rope_theta)
        k = rotary(k.view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2), positions, self.rope_theta)
        v = v.view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)
        keys, values = k, v
        if past_kv is not None:
            keys, values = torch.cat([past_kv[0], k], dim=2), torch.cat([past_kv[1], v], dim=2)
        rep = self.num_heads // self.num_kv_heads
        keys_r, values_r = keys.repeat_interleave(rep, dim=1), values.repeat_interleave(rep, dim=1)
        if attn_mask is None:
            out = F.scaled_dot_product_attention(q, keys_r, values_r, is_causal=past_kv is None)
        else:
            out = F.scaled_dot_product_attention(q, keys_r, values_r, attn_mask=attn_mask)
        out = self.o_proj(out.transpose(1, 2).reshape(B, T, q_size))
        return (out[0] if single else out), (k, v)


class DraftMLP(nn.Module):
    def __init__(self, config: DraftConfig) -> None:
        super().__init__()
        inter = config.intermediate_size
        self.gate_up_proj = StackedLinear(config.hidden_size, {0: inter, 1: inter})
        self.down_proj = nn.Linear(inter, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class Eagle3DecoderLayer(nn.Module):
    """SGLang's EAGLE-3 ``LlamaDecoderLayer``: q/k/v read ``cat(input_layernorm(embeds), hidden_norm(hidden))``."""

    def __init__(self, config: DraftConfig, honor_norm_before_residual: bool = False) -> None:
        super().__init__()
        self.self_attn = DraftAttention(config)
        self.mlp = DraftMLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        # SGLang never reads config.norm_before_residual; speculators' trainer does.
        self.norm_before_residual = bool(config.norm_before_residual and honor_norm_before_residual)

    def forward(
        self,
        positions: torch.Tensor,
        embeds: torch.Tensor,
        hidden_states: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        past_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Returns (mlp output, residual, this call's (k, v)); the caller adds them."""
        residual = hidden_states
        embeds = self.input_layernorm(embeds)
        hidden_states = self.hidden_norm(hidden_states)
        if self.norm_before_residual:
            residual = hidden_states
        attn, kv = self.self_attn(positions, torch.cat([embeds, hidden_states], dim=-1), attn_mask, past_kv)
        residual = attn + residual  # SGLang's fused add-then-norm
        hidden_states = self.mlp(self.post_attention_layernorm(residual))
        return hidden_states, residual, kv


class Eagle3DraftModel(nn.Module):
    """SGLang's ``llama_eagle3.LlamaModel``: embed, (maybe) fc, one decoder layer, norm."""

    def __init__(self, config: DraftConfig, engine_version: str = "0.5.23", honor_norm_before_residual: bool = False) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        hidden_in = config.target_hidden_size or config.hidden_size
        # SGLang hard-codes three aux chunks.
        self.fc = nn.Linear(3 * hidden_in, config.hidden_size, bias=False)
        layer = Eagle3DecoderLayer(config, honor_norm_before_residual)
        if engine_version == "older":
            self.midlayer = layer
        else:
            self.layers = nn.ModuleList([layer])
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    @property
    def decoder_layer(self) -> Eagle3DecoderLayer:
        return self.midlayer if hasattr(self, "midlayer") else self.layers[0]

    def project(self, embeds: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        # SGLang's test, verbatim: a 1x-hidden input silently skips fc.
        if hidden_states.shape[-1] != embeds.shape[-1]:
            hidden_states = self.fc(hidden_states)
        return hidden_states

    def forward(
        self, input_ids: torch.Tensor, hidden_states: torch.Tensor, positions: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Returns (normed states for logits, pre-norm states for the next step, layer input)."""
        embeds = self.embed_tokens(input_ids)
        if positions is None:
            positions = torch.arange(input_ids.shape[-1])
        hidden_in = self.project(embeds, hidden_states)
        out, residual, _ = self.decoder_layer(positions, embeds, hidden_in)
        pre_norm = out + residual
        return self.norm(pre_norm), pre_norm, hidden_in


class Eagle3Draft(nn.Module):
    """SGLang's ``LlamaForCausalLMEagle3`` in plain torch.

    ``hot_token_id`` (a buffer, None until a ``d2t`` is loaded) maps draft ids to target
    ids; with None, draft ids are taken as target ids, as SGLang's worker does.

        >>> draft = Eagle3Draft(DraftConfig(), engine_version="older")
        >>> draft.load_weights([("layers.0.mlp.down_proj.weight", torch.zeros(64, 96))])
        >>> draft.load_report.ignored
        ['layers.0.mlp.down_proj.weight']
    """

    def __init__(
        self,
        config: DraftConfig,
        engine_version: str = "0.5.23",
        honor_norm_before_residual: bool = False,
        init_seed: int = 1234,
    ) -> None:
        super().__init__()
        if engine_version not in ENGINE_VERSIONS:
            raise ValueError(f"engine_version must be one of {ENGINE_VERSIONS}, got {engine_version!r}")
        self.config = config
        self.engine_version = engine_version
        self.model = Eagle3DraftModel(config, engine_version, honor_norm_before_residual)
        self.load_lm_head_from_target = False
        if config.tie_word_embeddings:
            self.lm_head = self.model.embed_tokens
        else:
            if config.draft_vocab_size is None:
                self.load_lm_head_from_target = True
                config.draft_vocab_size = config.vocab_size
            self.lm_head = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)
        self.register_buffer("hot_token_id", None)
        self.capture_aux_hidden_states = True
        self.load_report = LoadReport()
        self._init_weights(init_seed)

    def _init_weights(self, seed: int) -> None:
        # A "random init" with a sane scale, like a freshly built engine module. The
        # trainer starts from another seed, so a tensor that never loads stays unrelated.
        gen = torch.Generator().manual_seed(seed)
        for name, param in self.named_parameters():
            if name.endswith("norm.weight"):
                continue
            with torch.no_grad():
                param.normal_(0.0, 1.0 / math.sqrt(param.shape[-1]), generator=gen)

    def forward(self, input_ids: torch.Tensor, hidden_states: torch.Tensor, positions: torch.Tensor | None = None) -> DraftOutput:
        """Draft logits over draft ids for (T,) ``input_ids`` and (T, width) ``hidden_states``."""
        normed, pre_norm, hidden_in = self.model(input_ids, hidden_states, positions)
        return DraftOutput(self.lm_head(normed), pre_norm, hidden_in)

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Target ids for draft ids (identity when no ``d2t`` was loaded)."""
        if self.hot_token_id is None:
            return draft_ids
        return self.hot_token_id[draft_ids]

    def get_hot_token_id(self) -> torch.Tensor | None:
        return self.hot_token_id

    def set_embed(self, embed: torch.Tensor) -> None:
        """Share the target's embedding (SGLang's ``set_embed`` at worker start-up).

        SGLang calls this unconditionally, skipping it only when the draft's hidden size
        differs from the target's, so a checkpoint's own ``embed_tokens`` is replaced.
        """
        target_hidden = self.config.target_hidden_size
        if target_hidden is not None and target_hidden != self.config.hidden_size:
            return
        del self.model.embed_tokens.weight
        self.model.embed_tokens.weight = embed if isinstance(embed, nn.Parameter) else nn.Parameter(embed)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load checkpoint tensors the way SGLang does; unknown names vanish silently."""
        params = dict(self.named_parameters())
        stacked = [
            (".qkv_proj", ".q_proj", "q"),
            (".qkv_proj", ".k_proj", "k"),
            (".qkv_proj", ".v_proj", "v"),
            (".gate_up_proj", ".gate_proj", 0),
            (".gate_up_proj", ".up_proj", 1),
        ]
        report = LoadReport()
        for offered, tensor in weights:
            report.offered.append(offered)
            name = offered
            if "d2t" in name:
                # d2t stores the difference between the target id and the draft id.
                self.hot_token_id = tensor.long() + torch.arange(tensor.shape[0])
                report.written.append(offered)
                continue
            if "t2d" in name:
                continue
            if self.engine_version != "older" and "midlayer." in name:
                # 0.5.23's legacy map; older engines named the module midlayer themselves.
                name = name.replace("midlayer.", "layers.0.")
            target_name: str | None = None
            shard: Any = None
            for param_name, weight_name, shard_id in stacked:
                if weight_name not in name:
                    continue
                name = name.replace(weight_name, param_name)
                target_name = name if name in params else f"model.{name}"
                shard = shard_id
                break
            else:
                target_name = name if name in params else f"model.{name}"
            if target_name not in params:
                report.ignored.append(offered)  # SGLang: no log, no error
                continue
            param = params[target_name]
            # SGLang's lookup, verbatim: the parameter's own loader, else the default.
            loader = getattr(param, "weight_loader", default_weight_loader)
            if shard is not None:
                loader(param, tensor, shard)
            else:
                loader(param, tensor)
            report.written.append(offered)
        self.load_report = report

    def engine_param_names(self) -> list[str]:
        """The parameter names the engine module exposes (what a checkpoint must reach)."""
        return [name for name, _ in self.named_parameters()]
