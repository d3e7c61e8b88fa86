"""Acceptance read with the requests' sampling: greedy apart from sampled, and simulated acceptance.

A sampled request (temperature > 0) accepts a draft token with probability
``min(1, p_target / p_draft)``: its accept length is bounded by how much the two
distributions overlap, and at temperature 1 a healthy draft can sit near 1. Low
acceptance on sampled requests is therefore no evidence against the wiring while the
greedy requests of the same run accept well; only greedy requests judge the draft.

:func:`judge_low_window` is asked when a window of verify steps averages at or below the
collapse floor. It returns the findings that replace ``acceptance_collapse`` when
sampling explains the window, or None when the collapse stands (then on the greedy
requests' figure, :attr:`SamplingTally.greedy_mean`).

    >>> tally = SamplingTally()
    >>> tally.add(Acceptance(step=0, accept_lengths=[1, 1], draft_tokens=3, greedy=[False, False], temperatures=[1.0, 1.0]))
    >>> [f.code for f in judge_low_window(tally, window_mean=1.0, draft_tokens=3, first_step=0, last_step=0)]
    ['acceptance_sampled']
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..records import Acceptance, Finding
from ..rules.acceptance import COLLAPSE_MEAN
from ..rules.catalogue import finding

SOURCE = "checks.acceptance_sampling"


@dataclass
class SamplingTally:
    """Accept lengths of a window, summed apart for greedy, sampled and unknown requests."""

    greedy_sum: int = 0
    greedy_n: int = 0
    sampled_sum: int = 0
    sampled_n: int = 0
    unknown_n: int = 0
    temperatures: set[float] = field(default_factory=set)

    def add(self, record: Acceptance) -> None:
        lengths, greedy = record.accept_lengths, record.greedy
        if greedy is None or len(greedy) != len(lengths):
            self.unknown_n += len(lengths)
            return
        temps = record.temperatures if record.temperatures and len(record.temperatures) == len(lengths) else None
        for i, (length, is_greedy) in enumerate(zip(lengths, greedy)):
            if is_greedy:
                self.greedy_sum += length
                self.greedy_n += 1
            else:
                self.sampled_sum += length
                self.sampled_n += 1
                if temps is not None and len(self.temperatures) < 8:
                    self.temperatures.add(round(float(temps[i]), 3))

    @property
    def known(self) -> bool:
        """Did the engine say how any of these requests were sampled?"""
        return bool(self.greedy_n or self.sampled_n)

    @property
    def greedy_mean(self) -> float | None:
        return self.greedy_sum / self.greedy_n if self.greedy_n else None

    @property
    def sampled_mean(self) -> float | None:
        return self.sampled_sum / self.sampled_n if self.sampled_n else None


def tally(records: list[Acceptance]) -> SamplingTally:
    out = SamplingTally()
    for record in records:
        out.add(record)
    return out


def _temps(t: SamplingTally) -> str:
    return ", ".join(f"{x:g}" for x in sorted(t.temperatures)) if t.temperatures else "> 0"


def judge_low_window(
    t: SamplingTally,
    *,
    window_mean: float,
    draft_tokens: int,
    first_step: int,
    last_step: int,
    floor: float = COLLAPSE_MEAN,
    source: str = SOURCE,
) -> list[Finding] | None:
    """Findings that replace ``acceptance_collapse`` for a low window, or None when it stands.

    None: the engine said nothing of sampling, every request was greedy, or the greedy
    requests are low too (the collapse is then theirs)."""
    if not t.known or not t.sampled_n:
        return None
    greedy, sampled = t.greedy_mean, t.sampled_mean
    assert sampled is not None
    evidence: dict[str, object] = {
        "window_mean": round(window_mean, 3),
        "sampled_mean": round(sampled, 3),
        "sampled_requests": t.sampled_n,
        "greedy_requests": t.greedy_n,
        "temperatures": sorted(t.temperatures),
        "draft_tokens": draft_tokens,
        "first_step": first_step,
    }
    if greedy is None:
        message = (
            f"every verified request in steps {first_step}..{last_step} was sampled (temperature {_temps(t)}): mean accept "
            f"length {sampled:.2f} (k={draft_tokens}) is bounded by the overlap of the target's and the draft's distributions, "
            "so it says nothing yet about the draft's wiring or training"
        )
        fix = (
            "probe greedily: send a few requests with temperature 0 and compare their accept length; a low greedy accept "
            "length points at the draft, a healthy one means this is what sampling at this temperature gets"
        )
        return [finding("acceptance_sampled", message, evidence=evidence, fix=fix, step=first_step, source=source)]
    evidence["greedy_mean"] = round(greedy, 3)
    if greedy <= floor + 1e-9:
        return None  # greedy requests collapse too: the draft is at fault, sampling or not
    message = (
        f"sampled requests (temperature {_temps(t)}) accept {sampled:.2f} in steps {first_step}..{last_step} while the greedy "
        f"requests of the same steps accept {greedy:.2f} (k={draft_tokens}): the draft and its wiring are healthy; sampling "
        "bounds acceptance by the overlap of the two distributions"
    )
    fix = (
        "nothing to fix in the draft; to raise sampled acceptance, lower the temperature, or train the draft on "
        "sampled targets (distillation on the target's distribution)"
    )
    return [finding("acceptance_sampled", message, evidence=evidence, fix=fix, step=first_step, source=source)]


# ------------------------------------------------------------------ simulated acceptance


def check_synthetic_acceptance(engine: str, settings: Mapping[str, object], *, source: str = SOURCE) -> list[Finding]:
    """``acceptance_synthetic`` when the engine's accept lengths are simulated.

    ``settings``: SGLang's environment (``SGLANG_SIMULATE_ACC_LEN`` > 0 switches its
    simulation on, ``SGLANG_SIMULATE_ACC_METHOD`` picks how), or vLLM's speculative
    config (``rejection_sample_method == "synthetic"`` with ``synthetic_acceptance_rates``)."""
    if engine == "sglang":
        raw = settings.get("SGLANG_SIMULATE_ACC_LEN")
        try:
            length = float(str(raw)) if raw is not None else -1.0
        except ValueError:
            return []
        if length <= 0:
            return []
        method = settings.get("SGLANG_SIMULATE_ACC_METHOD")
        message = (
            f"SGLANG_SIMULATE_ACC_LEN={raw} is set{f' (method {method})' if method else ''}: SGLang simulates acceptance, "
            "so every accept length in this trace is SYNTHETIC, set by that variable and not by the draft"
        )
        evidence: dict[str, object] = {"engine": engine, "setting": {"SGLANG_SIMULATE_ACC_LEN": raw, "SGLANG_SIMULATE_ACC_METHOD": method}}
        fix = "unset SGLANG_SIMULATE_ACC_LEN (and SGLANG_SIMULATE_ACC_METHOD) to measure the draft"
    elif engine == "vllm":
        if settings.get("rejection_sample_method") != "synthetic":
            return []
        rates = settings.get("synthetic_acceptance_rates")
        message = (
            f"vLLM's rejection_sample_method is 'synthetic' (rates {rates}): acceptance is simulated, so every accept "
            "length in this trace is SYNTHETIC, set by those rates and not by the draft"
        )
        evidence = {"engine": engine, "setting": {"rejection_sample_method": "synthetic", "synthetic_acceptance_rates": rates}}
        fix = "drop rejection_sample_method='synthetic' from the speculative config to measure the draft"
    else:
        return []
    return [finding("acceptance_synthetic", message, evidence=evidence, fix=fix, source=source)]
