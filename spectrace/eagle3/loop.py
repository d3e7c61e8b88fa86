"""Greedy chain speculation: the draft proposes k tokens, the target verifies them in one forward.

Mirrors SGLang's EAGLE-3 data flow without its batching or caches (every forward is
recomputed over the whole sequence, which is exact and cheap for tiny models):

- the draft's position t reads ``(token t+1, target states of position t)``;
- draft step 1 feeds the target's stored states (fc applies when they are 3x wide);
  steps 2..k feed the draft's own pre-norm output, which is 1x wide, so fc is skipped,
  exactly as in SGLang's draft decode;
- the verify accepts the longest prefix where draft token == target argmax, plus one
  bonus token from the target. The accept length is accepted + 1 (SGLang's metric), so
  1.0 means no draft token was ever accepted.

    >>> scenario = build_scenario("healthy")
    >>> result = speculate(scenario.target, scenario.draft, demo_prompts()[0], k=4, max_new_tokens=40)
    >>> result.accept_lengths
    [5, 5, 5, 5, 5, 5, 5, 5]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from .draft import Eagle3Draft
from .target import Eagle3Target

OnStep = Callable[[int, int, list[bool]], None]


@dataclass
class SpecResult:
    """Outcome of one speculative generation."""

    prompt: list[int]
    generated: list[int]
    k: int
    accept_lengths: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    draft_tokens: list[list[int]] = field(default_factory=list)

    @property
    def steps(self) -> int:
        return len(self.accept_lengths)

    @property
    def mean_accept_length(self) -> float:
        return sum(self.accept_lengths) / len(self.accept_lengths) if self.accept_lengths else 0.0


def draft_chain(draft: Eagle3Draft, tokens: Sequence[int], target_states: torch.Tensor, k: int) -> list[int]:
    """Propose ``k`` target ids greedily after ``tokens`` (target states cover all but the last token)."""
    ids = torch.tensor(list(tokens[1:]), dtype=torch.long)
    out = draft(ids, target_states)
    # What the decoder layer saw for the prefix (fc output, or raw states when fc was skipped).
    prefix_in = out.input_hidden
    feed = out.hidden_states[-1:]
    proposals: list[int] = []
    nxt = int(draft.draft_to_target(out.logits[-1].argmax()))
    proposals.append(nxt)
    extra_ids: list[int] = [nxt]
    extra_in: list[torch.Tensor] = [feed]
    for _ in range(k - 1):
        step_ids = torch.cat([ids, torch.tensor(extra_ids, dtype=torch.long)])
        step_in = torch.cat([prefix_in, *extra_in], dim=0)  # all 1x wide: fc skipped, as in draft decode
        out = draft(step_ids, step_in)
        nxt = int(draft.draft_to_target(out.logits[-1].argmax()))
        proposals.append(nxt)
        extra_ids.append(nxt)
        extra_in.append(out.hidden_states[-1:])
    return proposals


@torch.no_grad()
def speculate(
    target: Eagle3Target,
    draft: Eagle3Draft,
    prompt_ids: Sequence[int] | torch.Tensor,
    k: int = 4,
    max_new_tokens: int = 32,
    on_step: OnStep | None = None,
) -> SpecResult:
    """Generate ``max_new_tokens`` greedily with ``k``-token chain speculation.

    The output equals plain greedy decoding of the target; only the number of target
    forwards (``steps``) depends on the draft.
    """
    prompt = [int(t) for t in (prompt_ids.view(-1).tolist() if isinstance(prompt_ids, torch.Tensor) else prompt_ids)]
    if k < 1:
        raise ValueError("k must be >= 1")
    result = SpecResult(prompt=prompt, generated=[], k=k, accepted_per_position=[0] * k)
    tokens = list(prompt)
    prefill = target(torch.tensor(tokens))
    tokens.append(int(prefill.logits[-1].argmax()))
    states = prefill.hidden_states  # one row per token except the newest
    step = 0
    while len(tokens) - len(prompt) < max_new_tokens:
        proposals = draft_chain(draft, tokens, states, k)
        verify = target(torch.tensor(tokens + proposals))
        base = len(tokens) - 1  # logits row that predicts proposals[0]
        choices = verify.logits[base:].argmax(-1).tolist()
        accepted = 0
        while accepted < k and proposals[accepted] == choices[accepted]:
            accepted += 1
        mask = [i < accepted for i in range(k)]
        for i in range(accepted):
            result.accepted_per_position[i] += 1
        tokens.extend(proposals[:accepted])
        tokens.append(choices[accepted])  # the bonus token
        states = verify.hidden_states[: len(tokens) - 1]
        result.accept_lengths.append(accepted + 1)
        result.draft_tokens.append(proposals)
        if on_step is not None:
            on_step(step, accepted + 1, mask)
        step += 1
    result.generated = tokens[len(prompt) : len(prompt) + max_new_tokens]
    return result


def mean_accept_length(
    target: Eagle3Target,
    draft: Eagle3Draft,
    prompts: Sequence[Sequence[int]],
    k: int = 4,
    max_new_tokens: int = 32,
) -> float:
    """Accept length averaged over every verify step of every prompt.

    >>> s = build_scenario("fc_bypass")
    >>> round(mean_accept_length(s.target, s.draft, demo_prompts(), k=4, max_new_tokens=40), 2)
    1.08
    """
    lengths: list[int] = []
    for prompt in prompts:
        lengths.extend(speculate(target, draft, prompt, k=k, max_new_tokens=max_new_tokens).accept_lengths)
    return sum(lengths) / len(lengths) if lengths else 0.0
