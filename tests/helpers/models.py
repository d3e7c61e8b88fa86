"""Tiny real Hugging Face models built from configs (nothing downloaded), in the sizes the tests use."""

from __future__ import annotations


def tiny_llama(layers: int = 4, hidden: int = 64, vocab: int = 128):
    from spectrace.eagle3.target import tiny_llama as build

    return build(vocab_size=vocab, hidden_size=hidden, num_layers=layers, intermediate_size=2 * hidden)


def tiny_deepseek_v3(layers: int = 3):
    from spectrace.eagle3.target import tiny_deepseek_v3 as build

    return build(num_layers=layers)
