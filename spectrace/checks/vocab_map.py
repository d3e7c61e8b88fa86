"""Vocabulary maps: the draft's reduced vocabulary mapped back onto the target's.

A draft with ``draft_vocab_size`` < the target's vocabulary proposes draft ids; the
trainers save two maps beside its weights:

- ``d2t`` (int64, ``draft_vocab_size`` entries) stores offsets: draft id i is target id
  ``i + d2t[i]``. The trainers pick the draft vocabulary as a set of target ids and list
  it in order, so those ids rise strictly and lie in ``[0, target vocab)``;
- ``t2d`` (bool, one per target id) marks the same set.

SGLang 0.5.23 builds ``hot_token_id = d2t + arange(len(d2t))`` in
``LlamaForCausalLMEagle3.load_weights`` and skips ``t2d``; vLLM does the same with
``draft_id_to_target_id``. Neither checks the map: an id past the vocabulary fails at
the first proposal or indexes another token, and a wrong but valid map proposes other
tokens than the draft meant, so acceptance collapses with no error. A trainer's default
``d2t = arange(draft_vocab_size)`` (zeros were meant: offsets, not ids) maps i to 2i.

Pure functions over lists of ints: the audit reads the maps from the checkpoint, an
integration passes the engine's ``hot_token_id`` as a list.

    >>> [f.code for f in check_vocab_map(list(range(4)), [True] * 4 + [False] * 4, draft_vocab_size=4, target_vocab=8)]
    ['vocab_map_invalid']
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..records import Finding
from ..rules.catalogue import finding

MAX_SHOWN = 8  # ids listed in a message or in evidence


def target_ids(d2t: Sequence[int]) -> list[int]:
    """The target id of each draft id: ``i + d2t[i]`` (what SGLang's hot_token_id holds)."""
    return [i + int(d) for i, d in enumerate(d2t)]


def _shown(ids: Sequence[int]) -> str:
    ids = list(ids)
    return str(ids[:MAX_SHOWN])[:-1] + (f", ... ({len(ids)} in all)]" if len(ids) > MAX_SHOWN else "]")


def _is_arange_default(ids: Sequence[int]) -> bool:
    """Target ids 2i: the map ``d2t = arange`` gives (offsets taken for ids)."""
    return len(ids) > 1 and all(t == 2 * i for i, t in enumerate(ids))


def map_problems(
    ids: Sequence[int], *, draft_vocab_size: int | None, target_vocab: int | None, t2d: Sequence[bool] | None = None, name: str = "d2t"
) -> list[str]:
    """What is wrong with a draft->target id map (each a sentence with its figures)."""
    problems: list[str] = []
    if draft_vocab_size is not None and len(ids) != draft_vocab_size:
        problems.append(f"{name} has {len(ids)} entries but draft_vocab_size is {draft_vocab_size}")
    if target_vocab:
        outside = [i for i, t in enumerate(ids) if not 0 <= t < target_vocab]
        if outside:
            problems.append(
                f"{len(outside)} draft id(s) map outside the target vocabulary [0, {target_vocab}): "
                f"draft id {outside[0]} -> target id {ids[outside[0]]}"
            )
    falls = next((i for i in range(1, len(ids)) if ids[i] <= ids[i - 1]), None)
    if falls is not None:
        problems.append(
            f"target ids do not rise strictly: draft id {falls - 1} -> {ids[falls - 1]}, draft id {falls} -> {ids[falls]} "
            "(a map the trainers build lists each target id once, in order)"
        )
    if t2d is not None:
        if target_vocab and len(t2d) != target_vocab:
            problems.append(f"t2d has {len(t2d)} entries but the target vocabulary has {target_vocab}")
        marked = {i for i, flag in enumerate(t2d) if flag}
        mapped = set(ids)
        only_d2t, only_t2d = sorted(mapped - marked), sorted(marked - mapped)
        if only_d2t or only_t2d:
            problems.append(
                f"t2d marks another set of target ids than {name} maps to: {len(only_d2t)} mapped but not marked "
                f"{_shown(only_d2t)}, {len(only_t2d)} marked but not mapped {_shown(only_t2d)}"
            )
    return problems


def _finding(
    problems: list[str], ids: Sequence[int], arange: bool, *, subject: str, draft_vocab_size: int | None, target_vocab: int | None,
    module: str, source: str, fix: str, extra: dict[str, Any] | None = None,
) -> Finding:  # fmt: skip
    named = (
        f"; d2t is arange({len(ids)}), a trainer's placeholder default: d2t stores offsets (target id = i + d2t[i]), "
        "so it maps draft id i to target id 2i"
        if arange
        else ""
    )
    evidence: dict[str, Any] = {
        "problems": problems,
        "arange_default": arange,
        "first_ids": list(ids[:MAX_SHOWN]),
        "draft_vocab_size": draft_vocab_size,
        "target_vocab": target_vocab,
        **(extra or {}),
    }
    message = f"{subject}: {'; '.join(problems)}{named}. Draft tokens are proposed as other target tokens than the draft meant"
    return finding("vocab_map_invalid", message, module=module, evidence=evidence, fix=fix, source=source)


def check_vocab_map(
    d2t: Sequence[int] | None,
    t2d: Sequence[bool] | None,
    *,
    draft_vocab_size: int | None,
    target_vocab: int | None,
    module: str = "d2t",
    source: str = "",
) -> list[Finding]:
    """A checkpoint's ``d2t`` (offsets) and ``t2d`` (mask): length, range, order, agreement.

    ``d2t = arange`` is named when it is also wrong by another test (t2d disagrees, ids past
    the vocabulary): a map of even ids that t2d confirms is a valid map."""
    if d2t is None:
        return []  # a missing d2t is weights_missing's
    ids = target_ids(d2t)
    problems = map_problems(ids, draft_vocab_size=draft_vocab_size, target_vocab=target_vocab, t2d=t2d)
    if not problems:
        return []
    arange = _is_arange_default(ids)
    fix = (
        "rebuild d2t from the draft vocabulary the draft was trained on: with `ids` its target ids in rising order, "
        "d2t = ids - arange(len(ids)) (int64) and t2d = a bool mask over the target vocabulary with t2d[ids] = True"
    )
    if arange:
        fix = (
            "the trainer saved d2t = arange(draft_vocab_size) instead of the offsets of the draft vocabulary it trained "
            "with: " + fix + "; if t2d is the trained mask, ids = nonzero(t2d) and d2t = ids - arange(len(ids))"
        )
    return [
        _finding(
            problems, ids, arange, subject="the checkpoint's vocabulary map is invalid", draft_vocab_size=draft_vocab_size,
            target_vocab=target_vocab, module=module, source=source, fix=fix,
        )
    ]  # fmt: skip


def check_engine_hot_map(
    hot: Sequence[int],
    *,
    draft_vocab_size: int | None,
    target_vocab: int | None,
    checkpoint_d2t: Sequence[int] | None = None,
    t2d: Sequence[bool] | None = None,
    module: str = "draft.hot_token_id",
    source: str = "",
    name: str = "hot_token_id",
) -> list[Finding]:
    """The map the engine built (SGLang's ``hot_token_id``, vLLM's ``arange + draft_id_to_target_id``:
    target id per draft id, under ``name``) against the vocabulary and, when given, against what
    the checkpoint's ``d2t`` and ``t2d`` say."""
    ids = [int(t) for t in hot]
    problems = map_problems(ids, draft_vocab_size=draft_vocab_size, target_vocab=target_vocab, t2d=t2d, name=name)
    if checkpoint_d2t is not None:
        want = target_ids(checkpoint_d2t)
        differ = [i for i, (a, b) in enumerate(zip(ids, want)) if a != b]
        if differ or len(ids) != len(want):
            first = differ[0] if differ else min(len(ids), len(want))
            problems.append(
                f"the engine's map differs from the checkpoint's d2t at {len(differ)} draft id(s) (lengths {len(ids)} and "
                f"{len(want)}): draft id {first} -> {ids[first] if first < len(ids) else None}, the checkpoint says "
                f"{want[first] if first < len(want) else None}"
            )
    if not problems:
        return []
    arange = _is_arange_default(ids)
    fix = (
        "fix the checkpoint's d2t (offsets: d2t[i] = target id - i, rising target ids below the target vocabulary) "
        "and restart; if the checkpoint is right, find what rebuilt or resharded the map after load"
    )
    return [
        _finding(
            problems, ids, arange, subject=f"the draft->target map the engine built ({name}) is invalid",
            draft_vocab_size=draft_vocab_size, target_vocab=target_vocab, module=module, source=source, fix=fix,
        )
    ]  # fmt: skip
