"""spectrace's own EAGLE-3 reference draft: each module as the trainer computes it.

Written to EAGLE-3's semantics (speculators' and SpecForge's Llama draft) and to the
config's training flags: ``norm_before_fc`` (one RMSNorm over the fused input),
``fc_norm`` (one RMSNorm per chunk), ``norm_before_residual`` (the residual is the normed
hidden state), ``norm_output`` (the state fed back is the normed one; it changes no
boundary of one forward). Every module is a function of its own served inputs, so each
is judged alone: a module that computes something else is named, not the ones after it.
Computed in float32.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from ..audit.checkpoint import DraftCheckpoint


class ReferenceError(ValueError):
    """A checkpoint the reference cannot run (a one-line message)."""


@dataclass
class Reference:
    """The reference draft of one checkpoint."""

    w: dict[str, torch.Tensor]
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    rope_theta: float
    chunks: int
    flags: dict[str, bool] = field(default_factory=dict)
    d2t: list[int] | None = None
    notes: list[str] = field(default_factory=list)
    rope_neox: bool = True  # half-split (neox) rotary; False: adjacent pairs (gptj, interleaved)

    @classmethod
    def build(cls, ckpt: DraftCheckpoint, raw: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Reference:
        c = ckpt.config
        if c.num_hidden_layers != 1:
            raise ReferenceError(f"the draft has {c.num_hidden_layers} decoder layers; the built-in reference runs one")
        nested = raw.get("transformer_layer_config")
        layer_cfg: dict[str, Any] = nested if isinstance(nested, dict) else raw
        rope = c.rope
        theta = (rope.rope_parameters or {}).get("rope_theta") or rope.rope_theta or 10000.0
        scaling = (rope.rope_parameters or {}).get("rope_type") or (rope.rope_scaling or {}).get("rope_type") or "default"
        notes = []
        if scaling not in ("default", None):
            notes.append(f"rope type {scaling!r}: the reference applies the plain rotary with base {theta}")
        w = {k: v.float() for k, v in tensors.items() if v.dtype.is_floating_point}
        if "layers.0.self_attn.qkv_proj.weight" in w:  # a fused checkpoint: split as the engine's shards are
            q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
            wq, wk, wv = w.pop("layers.0.self_attn.qkv_proj.weight").split([q, kv, kv])
            w.update(
                {"layers.0.self_attn.q_proj.weight": wq, "layers.0.self_attn.k_proj.weight": wk, "layers.0.self_attn.v_proj.weight": wv}
            )
        if "layers.0.mlp.gate_up_proj.weight" in w:
            g, u = w.pop("layers.0.mlp.gate_up_proj.weight").chunk(2)
            w.update({"layers.0.mlp.gate_proj.weight": g, "layers.0.mlp.up_proj.weight": u})
        fc = w.get("fc.weight")
        chunks = int(fc.shape[1] // (c.target_hidden_size or c.hidden_size)) if fc is not None else 3
        return cls(
            w=w,
            hidden=c.hidden_size,
            heads=c.num_attention_heads,
            kv_heads=c.num_key_value_heads,
            head_dim=c.head_dim,
            eps=float(layer_cfg.get("rms_norm_eps", 1e-6) or 1e-6),
            rope_theta=float(theta),
            chunks=chunks,
            flags={**c.flags, "tie_word_embeddings": c.tie_word_embeddings},
            d2t=ckpt.maps.d2t,
            notes=notes,
            rope_neox=bool(layer_cfg.get("rope_is_neox_style", True)),
        )

    # ------------------------------------------------------------- modules
    def rms(self, x: torch.Tensor, name: str) -> torch.Tensor:
        x = x.float()
        out = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        weight = self.w.get(name)
        return out * weight if weight is not None else out

    def embed(self, ids: torch.Tensor) -> torch.Tensor | None:
        table = self.w.get("embed_tokens.weight")
        return table[ids.long()] if table is not None else None

    def fc(self, fused: torch.Tensor) -> torch.Tensor | None:
        """fc over the fused input, after the input norms the flags ask for."""
        weight = self.w.get("fc.weight")
        if weight is None:
            return None
        x = fused.float()
        if self.flags.get("norm_before_fc"):
            x = self.rms(x, "input_norm.weight")
        if self.flags.get("fc_norm"):
            x = torch.cat([self.rms(chunk, f"fc_norm.{i}.weight") for i, chunk in enumerate(x.chunk(self.chunks, dim=-1))], dim=-1)
        return F.linear(x, weight, self.w.get("fc.bias"))

    def fc_only(self, fc_in: torch.Tensor) -> torch.Tensor | None:
        """fc on what the engine's fc read (its input norms already applied)."""
        weight = self.w.get("fc.weight")
        return F.linear(fc_in.float(), weight, self.w.get("fc.bias")) if weight is not None else None

    def rotary(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        dim = x.shape[-1]
        inv = 1.0 / (self.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
        freqs = positions.float()[:, None] * inv[None, :]
        if not self.rope_neox:  # gptj: each adjacent pair (x[2i], x[2i+1]) turns by freqs[i]
            even, odd = x[..., 0::2], x[..., 1::2]
            c, s = freqs.cos(), freqs.sin()
            return torch.stack([even * c - odd * s, odd * c + even * s], dim=-1).flatten(-2)
        cos, sin = torch.cat([freqs, freqs], -1).cos(), torch.cat([freqs, freqs], -1).sin()
        x1, x2 = x[..., : dim // 2], x[..., dim // 2 :]
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin

    def layer(self, positions: torch.Tensor, embeds: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """The decoder layer's output plus residual for rows at ``positions`` (causal over these rows)."""
        p = "layers.0."
        residual = hidden.float()
        h = self.rms(hidden, p + "hidden_norm.weight")
        if self.flags.get("norm_before_residual"):
            residual = h
        x = torch.cat([self.rms(embeds, p + "input_layernorm.weight"), h], dim=-1)
        T = x.shape[0]
        q = F.linear(x, self.w[p + "self_attn.q_proj.weight"]).view(T, self.heads, self.head_dim).transpose(0, 1)
        k = F.linear(x, self.w[p + "self_attn.k_proj.weight"]).view(T, self.kv_heads, self.head_dim).transpose(0, 1)
        v = F.linear(x, self.w[p + "self_attn.v_proj.weight"]).view(T, self.kv_heads, self.head_dim).transpose(0, 1)
        q, k = self.rotary(q, positions), self.rotary(k, positions)
        rep = self.heads // self.kv_heads
        out = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0), is_causal=True)
        residual = F.linear(out.transpose(0, 1).reshape(T, -1), self.w[p + "self_attn.o_proj.weight"]) + residual
        m = self.rms(residual, p + "post_attention_layernorm.weight")
        mlp = F.linear(
            F.silu(F.linear(m, self.w[p + "mlp.gate_proj.weight"])) * F.linear(m, self.w[p + "mlp.up_proj.weight"]),
            self.w[p + "mlp.down_proj.weight"],
        )
        return mlp + residual

    def norm(self, layer_out: torch.Tensor) -> torch.Tensor:
        return self.rms(layer_out, "norm.weight")

    def head_weight(self) -> torch.Tensor | None:
        return self.w.get("lm_head.weight", self.w.get("embed_tokens.weight") if self.flags.get("tie_word_embeddings") else None)

    def target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        if self.d2t is None:
            return draft_ids.long()
        return draft_ids.long() + torch.tensor(self.d2t, dtype=torch.long)[draft_ids.long()]
