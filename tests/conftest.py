"""Shared fixtures: tiny real Hugging Face models built from configs (nothing downloaded)."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")  # DeepSeek routing is torch.compiled; eager is faster for tiny models


def tiny_llama(layers: int = 4, hidden: int = 64, vocab: int = 128):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    return LlamaForCausalLM(config).eval()


def tiny_deepseek_v3(layers: int = 3):
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(0)
    config = DeepseekV3Config(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_shared_experts=1,
        n_group=2,
        topk_group=1,
        first_k_dense_replace=1,
        q_lora_rank=32,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=16,
        max_position_embeddings=256,
    )
    return DeepseekV3ForCausalLM(config).eval()


@pytest.fixture
def llama():
    return tiny_llama()


@pytest.fixture
def deepseek():
    return tiny_deepseek_v3()


@pytest.fixture
def no_spectrace_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith("SPECTRACE") or name.startswith("OTEL_"):
            monkeypatch.delenv(name, raising=False)
