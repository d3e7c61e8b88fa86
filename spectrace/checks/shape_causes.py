"""One ``shape_mismatch`` for the config key that every misfit tensor follows from.

A draft config whose ``hidden_size`` says 128 over weights 64 wide makes every tensor of
the decoder layer, the norm and the head misfit: twelve findings that each say a shape,
none the cause. When two or more misfits differ from the engine's shapes in the same
proportion, and one config key's value is the engine's side of it (with the weights'
own width on the other, read from a 1-D tensor or the most common misfit), they are one
finding naming the key and both values; the misfits that proportion does not explain
keep a finding each.

    >>> errors = [("norm.weight", "model.norm.weight", [64], (128,)),
    ...           ("lm_head.weight", "lm_head.weight", [128, 64], (128, 128))]
    >>> group_by_config_key(errors, {"hidden_size": 128, "vocab_size": 128})[0][0]
    ('hidden_size', 128, 64)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

ShapeError = tuple[str, str, list[int], tuple[int, ...]]  # (tensor, engine parameter, shape, expected)
# The config keys whose values set the draft's tensor widths, in the order they are tried.
WIDTH_KEYS = ("hidden_size", "intermediate_size", "head_dim", "vocab_size", "draft_vocab_size")


def _differing(got: Sequence[int], want: Sequence[int]) -> list[tuple[int, int]]:
    """The (expected, found) sizes of the axes that differ; None-like for another rank."""
    if len(got) != len(want):
        return []
    return [(w, g) for g, w in zip(got, want) if g != w]


def _weights_value(errors: Sequence[ShapeError], value: int) -> int | None:
    """What the weights say the key is: the found size where the engine expected ``value``
    itself (a norm's [64] against [128]), the most common one."""
    found = Counter(g for _, _, got, want in errors for w, g in _differing(got, want) if w == value)
    return found.most_common(1)[0][0] if found else None


def _explained(error: ShapeError, value: int, weights: int) -> bool:
    """Every differing axis is the config's value scaled as the weights' is (``w * weights
    == g * value``): 256 expected for 128 found is the same 2:1 as hidden 128 vs 64."""
    pairs = _differing(error[2], error[3])
    return bool(pairs) and all(w * weights == g * value for w, g in pairs)


def group_by_config_key(
    errors: Sequence[ShapeError], config: Mapping[str, int | None]
) -> tuple[list[tuple[tuple[str, int, int], list[ShapeError]]], list[ShapeError]]:
    """``([((key, config value, weights' value), misfits it explains), ...], the rest)``;
    a key explains two misfits at least, or none."""
    rest = list(errors)
    groups: list[tuple[tuple[str, int, int], list[ShapeError]]] = []
    for key in WIDTH_KEYS:
        value = config.get(key)
        if not value or len(rest) < 2:
            continue
        weights = _weights_value(rest, value)
        if weights is None:
            continue
        explained = [e for e in rest if _explained(e, value, weights)]
        if len(explained) >= 2:
            groups.append(((key, value, weights), explained))
            rest = [e for e in rest if e not in explained]
    return groups, rest
