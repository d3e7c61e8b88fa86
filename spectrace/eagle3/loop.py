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
- with ``temperature > 0`` the draft samples its proposals and the verify is speculative
  sampling (Leviathan et al.): token x is kept with probability min(1, p(x)/q(x)), a
  rejection resamples from max(0, p - q), so the output follows the target's sampled
  distribution and the accept length is bounded by the overlap of p and q.

    >>> scenario = build_scenario("healthy")
    >>> result = speculate(scenario.target, scenario.draft, demo_prompts()[0], k=4, max_new_tokens=40)
    >>> result.accept_lengths
    [5, 5, 5, 5, 5, 5, 5, 5]
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
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


class _Sampler:
    """Greedy (temperature 0) or sampled choices over logits; ``dists`` keeps the draft's
    distributions over target ids for the verify's acceptance test."""

    def __init__(self, temperature: float, generator: torch.Generator | None) -> None:
        self.temperature = temperature
        self.generator = generator
        self.dists: list[torch.Tensor] = []

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.softmax(logits.float() / self.temperature, dim=-1)

    def draft_pick(self, draft: Eagle3Draft, logits: torch.Tensor, vocab: int) -> int:
        if self.temperature <= 0:
            return int(draft.draft_to_target(logits.argmax()))
        q_draft = self.probs(logits)
        q = torch.zeros(vocab, dtype=q_draft.dtype)
        q.index_add_(0, draft.draft_to_target(torch.arange(q_draft.numel())).long().clamp(0, vocab - 1), q_draft)
        self.dists.append(q)
        return int(torch.multinomial(q, 1, generator=self.generator))

    def draw(self, p: torch.Tensor) -> int:
        return int(torch.multinomial(p, 1, generator=self.generator))


def draft_chain(
    draft: Eagle3Draft, tokens: Sequence[int], target_states: torch.Tensor, k: int, sampler: _Sampler | None = None, vocab: int = 0
) -> list[int]:
    """Propose ``k`` target ids after ``tokens`` (target states cover all but the last token):
    greedily, or sampled by ``sampler`` over a target vocabulary of ``vocab`` ids."""
    pick = sampler or _Sampler(0.0, None)
    ids = torch.tensor(list(tokens[1:]), dtype=torch.long)
    out = draft(ids, target_states)
    # What the decoder layer saw for the prefix (fc output, or raw states when fc was skipped).
    prefix_in = out.input_hidden
    feed = out.hidden_states[-1:]
    proposals: list[int] = []
    nxt = pick.draft_pick(draft, out.logits[-1], vocab)
    proposals.append(nxt)
    extra_ids: list[int] = [nxt]
    extra_in: list[torch.Tensor] = [feed]
    for _ in range(k - 1):
        step_ids = torch.cat([ids, torch.tensor(extra_ids, dtype=torch.long)])
        step_in = torch.cat([prefix_in, *extra_in], dim=0)  # all 1x wide: fc skipped, as in draft decode
        out = draft(step_ids, step_in)
        nxt = pick.draft_pick(draft, out.logits[-1], vocab)
        proposals.append(nxt)
        extra_ids.append(nxt)
        extra_in.append(out.hidden_states[-1:])
    return proposals


@torch.no_grad()
@contextmanager
def one_thread() -> Iterator[None]:
    """Run the tiny pair on one intra-op thread, then give the process its own count back.

    At hidden size 64 torch's thread pool costs more than it saves, and two such processes
    on two cores spin against each other: two demos side by side took 95 s each with
    torch's default threads and 23 s with one (the same accept lengths).
    """
    before = torch.get_num_threads()
    if before == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def speculate(
    target: Eagle3Target,
    draft: Eagle3Draft,
    prompt_ids: Sequence[int] | torch.Tensor,
    k: int = 4,
    max_new_tokens: int = 32,
    on_step: OnStep | None = None,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
) -> SpecResult:
    """Generate ``max_new_tokens`` with ``k``-token chain speculation.

    Greedy (``temperature`` 0): the output equals plain greedy decoding of the target; only
    the number of target forwards (``steps``) depends on the draft. Sampled: speculative
    sampling, seeded by ``generator``. Runs on one thread (:func:`one_thread`).
    """
    with one_thread():
        return _speculate(target, draft, prompt_ids, k, max_new_tokens, on_step, temperature, generator)


def _speculate(
    target: Eagle3Target,
    draft: Eagle3Draft,
    prompt_ids: Sequence[int] | torch.Tensor,
    k: int,
    max_new_tokens: int,
    on_step: OnStep | None,
    temperature: float,
    generator: torch.Generator | None,
) -> SpecResult:
    prompt = [int(t) for t in (prompt_ids.view(-1).tolist() if isinstance(prompt_ids, torch.Tensor) else prompt_ids)]
    if k < 1:
        raise ValueError("k must be >= 1")
    result = SpecResult(prompt=prompt, generated=[], k=k, accepted_per_position=[0] * k)
    tokens = list(prompt)
    sampler = _Sampler(temperature, generator) if temperature > 0 else None
    prefill = target(torch.tensor(tokens))
    vocab = int(prefill.logits.shape[-1])
    tokens.append(int(prefill.logits[-1].argmax()) if sampler is None else sampler.draw(sampler.probs(prefill.logits[-1])))
    states = prefill.hidden_states  # one row per token except the newest
    step = 0
    while len(tokens) - len(prompt) < max_new_tokens:
        if sampler is not None:
            sampler.dists = []
        proposals = draft_chain(draft, tokens, states, k, sampler, vocab)
        verify = target(torch.tensor(tokens + proposals))
        base = len(tokens) - 1  # logits row that predicts proposals[0]
        if sampler is None:
            choices = verify.logits[base:].argmax(-1).tolist()
            accepted = 0
            while accepted < k and proposals[accepted] == choices[accepted]:
                accepted += 1
        else:
            accepted, choices = _verify_sampled(sampler, verify.logits[base:], proposals)
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


def _verify_sampled(sampler: _Sampler, logits: torch.Tensor, proposals: list[int]) -> tuple[int, list[int]]:
    """Speculative sampling's verify: keep x with probability min(1, p(x)/q(x)); the first
    rejection draws from max(0, p - q) normalised; all kept, the bonus draws from p.
    Returns the accepted count and the choices (``choices[accepted]`` is the next token)."""
    accepted = 0
    choices = list(proposals)
    for i, x in enumerate(proposals):
        p = sampler.probs(logits[i])
        q = sampler.dists[i]
        keep = torch.rand((), generator=sampler.generator) * q[x] <= p[x]
        if not bool(keep):
            residual = (p - q).clamp_min(0)
            total = residual.sum()
            choices[i] = sampler.draw(residual / total if float(total) > 0 else p)
            return accepted, choices
        accepted += 1
    choices.append(sampler.draw(sampler.probs(logits[len(proposals)])))
    return accepted, choices
