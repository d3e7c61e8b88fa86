"""One validated settings object read from ``SPECTRACE_*`` variables.

A bad value never raises: it prints one warning naming the variable and the fallback
(once per process for each bad value, however often the environment is read), and the
fallback is what the settings hold and show. Every number is bounded: a value past its
bound is bad too (a record cap of 10^20 would not even fit a C ``ssize_t``).

    >>> settings = Settings.from_env()
    >>> settings.stats
    'basic'
"""

from __future__ import annotations

import math
import os
import re
import sys
import threading
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

StatsMode = Literal["off", "basic", "full"]
STATS_MODES = ("off", "basic", "full")

DEFAULT_RECORD_CAP = 100_000
DEFAULT_FLUSH_SECONDS = 2.0
# Upper bounds: past them a value is a typo, not a choice. 10M calls kept in memory are
# ~5 GB already; a flush interval of a day is "at exit".
MAX_RECORD_CAP = 10_000_000
MAX_SAMPLE = 1_000_000
MAX_FLUSH_SECONDS = 86_400.0
# Tokens of the fused draft input kept per captured step (SPECTRACE_CAPTURE_VALUES): a
# train-vs-serve comparison needs tens of them; 4096 rows of a 3 x 8192 fused input are
# already 200 MB of bf16 per step.
MAX_CAPTURE_VALUES = 4096
REDACTED = "<redacted>"
# The named module lists of hooks/selection.py (which imports torch; this module must not).
PROFILE_NAMES = ("default", "hf", "eagle3", "all")


def warn(message: str) -> None:
    """Print one spectrace warning line to stderr (never raises)."""
    try:
        sys.stderr.write(f"spectrace: warning: {message}\n")
    except Exception:  # a closed stderr must not break the host
        pass


_bad_said: set[tuple[str, str]] = set()
_bad_lock = threading.Lock()


def _bad(name: str, raw: str, message: str) -> None:
    """Warn about a bad value once per process (the environment is read by every ``trace()``)."""
    with _bad_lock:
        if (name, raw) in _bad_said:
            return
        _bad_said.add((name, raw))
    warn(message)


def redact_url(url: str) -> str:
    """An endpoint as a trace or a terminal may show it: no ``user:token@``, no query values.

    >>> redact_url("https://user:tok@collector:4318/v1/traces?api_key=s3cret&tenant=a#frag")
    'https://<redacted>@collector:4318/v1/traces?api_key=<redacted>&tenant=<redacted>'
    """
    url = re.sub(r"(?<=://)[^/@?#]*@", REDACTED + "@", url)
    url = url.split("#", 1)[0]
    base, sep, query = url.partition("?")
    if not sep:
        return url
    parts = [p.split("=", 1)[0] + "=" + REDACTED if p else p for p in query.split("&")]
    return base + "?" + "&".join(parts)


def redact_urls(text: str) -> str:
    """Every URL inside ``text`` (an error message, say) passed through :func:`redact_url`."""
    return re.sub(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+", lambda m: redact_url(m.group(0)), text)


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


def _flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    _bad(name, raw, f"{name}={_shown(raw)} is not a boolean (1/0/true/false); using {int(default)}")
    return default


def _shown(raw: str) -> str:
    """A bad value as a warning quotes it: at most 40 characters (it may be anything)."""
    return repr(raw) if len(raw) <= 40 else repr(raw[:40]) + "..."


def _positive_int(env: Mapping[str, str], name: str, default: int, maximum: int) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    text = raw.strip()
    # Digits only, and few of them: int() of a 5,000-digit string raises, and a huge
    # value would overflow the C size of the buffer it sets.
    if text.isdigit() and len(text) <= 19 and 1 <= int(text) <= maximum:
        return int(text)
    _bad(name, raw, f"{name}={_shown(raw)} is not an integer from 1 to {maximum}; using {default}")
    return default


def _count(env: Mapping[str, str], name: str, maximum: int) -> int:
    """An integer from 0 (off, the default) to ``maximum``."""
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return 0
    text = raw.strip()
    if text.isdigit() and len(text) <= 19 and int(text) <= maximum:
        return int(text)
    _bad(name, raw, f"{name}={_shown(raw)} is not an integer from 0 (off) to {maximum}; using 0 (off)")
    return 0


def _positive_float(env: Mapping[str, str], name: str, default: float, maximum: float) -> float:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw) if len(raw) <= 64 else math.nan
    except ValueError:
        value = math.nan
    if math.isfinite(value) and 0 < value <= maximum:
        return value
    _bad(name, raw, f"{name}={_shown(raw)} is not a number above 0 and at most {maximum:g}; using {default}")
    return default


BUDGET_MIN = 1e-6  # the smallest budget share (0.0001 %): below it the interval's arithmetic overflows


def _budget(env: Mapping[str, str], name: str) -> float:
    """A share of the step time: ``3%`` or ``0.03``, from 0.0001 % to 100 %; 0 (off) when unset."""
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return 0.0
    text = raw.strip()
    percent = text.endswith("%")
    try:
        value = float(text[:-1] if percent else text) if len(text) <= 64 else math.nan
    except ValueError:
        value = math.nan
    if percent:
        value /= 100
    if value == 0 or (math.isfinite(value) and BUDGET_MIN <= value <= 1):
        return value
    _bad(name, raw, f"{name}={_shown(raw)} is not a share of the step time (3% or 0.03, 0.0001% to 100%); using 0 (off: every step traced)")
    return 0.0


def _choice(env: Mapping[str, str], name: str, choices: tuple[str, ...], default: str) -> str:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value not in choices:
        _bad(name, raw, f"{name}={_shown(raw)} is not one of {', '.join(choices)}; using {default!r}")
        return default
    return value


def _patterns(env: Mapping[str, str], name: str) -> tuple[str, ...]:
    raw = env.get(name, "")
    return tuple(p.strip() for p in raw.split(",") if p.strip())


@dataclass(frozen=True)
class Settings:
    """Everything spectrace reads from the environment, validated once."""

    enabled: bool = False
    dir: str = "spectrace-traces"
    modules: tuple[str, ...] = ()
    profile: str = ""
    stats: StatsMode = "basic"
    sample: int = 1
    # A share of the step time tracing may add (0.03: 3 %): one step in N traced, N measured
    # as the loop runs (hooks/budget.py). 0: off, every step (or every SAMPLE-th) traced.
    budget: float = 0.0
    record_cap: int = DEFAULT_RECORD_CAP
    flush_seconds: float = DEFAULT_FLUSH_SECONDS
    keep_argv: bool = False  # the header keeps the command line's option values
    # Statistics of tensors that are a function of one token id (embedding outputs, and
    # the same tensors as the next module's input): off by default, as at a one-token
    # decode step they spell the token out against the embedding table.
    token_stats: bool = False
    quiet: bool = False
    otlp_endpoint: str = ""  # the OTEL_EXPORTER_OTLP(_TRACES)_ENDPOINT in effect: turns spans on
    sglang_skip: tuple[str, ...] = ()  # SGLang patch-point features left unpatched (reported once)
    sglang_layers: str = "captured"  # target layers hooked in SGLang: those the draft reads (+ the last), or "all"
    graph_sample: int = 64  # in-graph statistics read back after 1 in N replays of each captured graph
    fingerprint: str = ""  # a training fingerprint (spectrace fingerprint) to compare the live draft input with
    control: str = ""  # a file whose first word ("off"/"on") pauses or resumes per-step work at run time
    # Tensor VALUES (user data): the first N tokens of the fused draft input and their ids,
    # for a few steps, in a safetensors file beside the trace (hooks/values.py). 0: off.
    capture_values: int = 0

    def __post_init__(self) -> None:
        # Settings built in code get the bounds the environment gets (a deque of 10^20 raises).
        for name, low, high in (("record_cap", 1, MAX_RECORD_CAP), ("sample", 1, MAX_SAMPLE), ("graph_sample", 1, MAX_SAMPLE)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                fallback = getattr(type(self), name)
                _bad(name, repr(value), f"Settings({name}={value!r}) is not an integer from {low} to {high}; using {fallback}")
                object.__setattr__(self, name, fallback)
        seconds = self.flush_seconds
        if not isinstance(seconds, (int, float)) or not (math.isfinite(seconds) and 0 < seconds <= MAX_FLUSH_SECONDS):
            _bad(
                "flush_seconds",
                repr(seconds),
                f"Settings(flush_seconds={seconds!r}) is not a number above 0 and at most {MAX_FLUSH_SECONDS:g}; using {DEFAULT_FLUSH_SECONDS}",
            )
            object.__setattr__(self, "flush_seconds", DEFAULT_FLUSH_SECONDS)
        budget = self.budget
        if (
            not isinstance(budget, (int, float))
            or isinstance(budget, bool)
            or not (budget == 0 or math.isfinite(budget) and BUDGET_MIN <= budget <= 1)
        ):
            _bad("budget", repr(budget), f"Settings(budget={budget!r}) is not 0 (off) or a share from {BUDGET_MIN:g} to 1; using 0 (off)")
            object.__setattr__(self, "budget", 0.0)
        values = self.capture_values
        if not isinstance(values, int) or isinstance(values, bool) or not 0 <= values <= MAX_CAPTURE_VALUES:
            _bad(
                "capture_values",
                repr(values),
                f"Settings(capture_values={values!r}) is not an integer from 0 (off) to {MAX_CAPTURE_VALUES}; using 0 (off)",
            )
            object.__setattr__(self, "capture_values", 0)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        stats = _choice(env, "SPECTRACE_STATS", STATS_MODES, "basic")
        keep_argv = _flag(env, "SPECTRACE_KEEP_ARGV", False)
        if keep_argv:
            warn("SPECTRACE_KEEP_ARGV=1: trace headers keep the full command line (prompts, tokens, paths); keep them private")
        capture_values = _count(env, "SPECTRACE_CAPTURE_VALUES", MAX_CAPTURE_VALUES)
        if capture_values:
            _bad(
                "SPECTRACE_CAPTURE_VALUES",
                str(capture_values),
                f"SPECTRACE_CAPTURE_VALUES={capture_values}: tensor values and token ids of the fused draft input are "
                "written beside the trace (*.values.safetensors); they are user data, keep them private",
            )
        return cls(
            enabled=_flag(env, "SPECTRACE", False),
            dir=env.get("SPECTRACE_DIR", "").strip() or "spectrace-traces",
            modules=_patterns(env, "SPECTRACE_MODULES"),
            profile=_choice(env, "SPECTRACE_PROFILE", PROFILE_NAMES, ""),
            stats=stats,  # type: ignore[arg-type]
            sample=_positive_int(env, "SPECTRACE_SAMPLE", 1, MAX_SAMPLE),
            budget=_budget(env, "SPECTRACE_BUDGET"),
            record_cap=_positive_int(env, "SPECTRACE_RECORD_CAP", DEFAULT_RECORD_CAP, MAX_RECORD_CAP),
            flush_seconds=_positive_float(env, "SPECTRACE_FLUSH_SECONDS", DEFAULT_FLUSH_SECONDS, MAX_FLUSH_SECONDS),
            token_stats=_flag(env, "SPECTRACE_TOKEN_STATS", False),
            keep_argv=keep_argv,
            quiet=_flag(env, "SPECTRACE_QUIET", False),
            sglang_skip=_patterns(env, "SPECTRACE_SGLANG_SKIP"),
            sglang_layers=_choice(env, "SPECTRACE_SGLANG_LAYERS", ("captured", "all"), "captured"),
            graph_sample=_positive_int(env, "SPECTRACE_GRAPH_SAMPLE", 64, MAX_SAMPLE),
            fingerprint=env.get("SPECTRACE_FINGERPRINT", "").strip(),
            control=env.get("SPECTRACE_CONTROL", "").strip(),
            capture_values=capture_values,
            # Only "is an endpoint set" (spans on) and what to show: the OTLP exporter reads
            # the URL and the rest from the environment itself (sinks/otel.py). The signal
            # variable wins, as in the spec.
            otlp_endpoint=env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip() or env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip(),
        )

    def dir_from_env(self, env: Mapping[str, str] | None = None) -> str | None:
        """The trace folder only when ``SPECTRACE_DIR`` was set explicitly."""
        env = os.environ if env is None else env
        return env.get("SPECTRACE_DIR", "").strip() or None

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["modules"] = list(self.modules)
        return data

    def safe_dict(self) -> dict[str, Any]:
        """:meth:`as_dict` as a trace header or a terminal may show it: the endpoint
        without credentials or query values (an ``?api_key=`` rides there)."""
        data = self.as_dict()
        data["otlp_endpoint"] = redact_url(self.otlp_endpoint)
        return data

    def describe(self) -> str:
        """The settings in effect, one per line (``spectrace settings``), secrets redacted,
        then the module globs a traced program hooks under them and where those come from."""
        from .rules.profiles import modules_in_effect

        lines = [f"{k} = {v!r}" for k, v in self.safe_dict().items()]
        globs, source = modules_in_effect(tuple(self.modules), self.profile)
        lines.append(f"# hooked modules ({source}): {', '.join(globs)}")
        if not self.enabled:
            lines.append("# tracing is off here: SPECTRACE=1 turns it on for any Python program")
        return "\n".join(lines)
