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
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any, Literal

StatsMode = Literal["off", "basic", "full"]
STATS_MODES = ("off", "basic", "full")

DEFAULT_RECORD_CAP = 100_000
DEFAULT_FLUSH_SECONDS = 2.0
# Upper bounds: past them a value is a typo, not a choice. 10M calls kept in memory are
# ~5 GB already; a flush interval of a day is "at exit".
MAX_RECORD_CAP = 10_000_000
# SPECTRACE_MAX_FILE_MB: past this size a trace file keeps only its findings, coverage and
# counters (per-step records are dropped and counted). A server traced for a day writes
# 2.5 MiB/s of per-step records; 1 GiB is some minutes of them, and a view of it reads fast.
DEFAULT_MAX_FILE_MB = 1024
MAX_FILE_MB = 1_000_000
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


# The lists that :func:`bad_values` is collecting into (every bad value, said before or not).
_collecting: list[list[str]] = []


@contextmanager
def bad_values() -> Iterator[list[str]]:
    """The names of the bad values met while the block runs (``spectrace settings`` exits 2
    on any): ``with bad_values() as bad: Settings.from_env()``."""
    found: list[str] = []
    with _bad_lock:
        _collecting.append(found)
    try:
        yield found
    finally:
        with _bad_lock:
            _collecting.remove(found)


def _bad(name: str, raw: str, message: str) -> None:
    """Warn about a bad value once per process (the environment is read by every ``trace()``)."""
    with _bad_lock:
        for found in _collecting:
            if name not in found:
                found.append(name)
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
    """A bad value as a warning quotes it: ASCII only (a terminal escape or a stray byte in
    the environment must not reach the terminal, and an ASCII-only stderr must not fail to
    write it), at most 40 characters of it (it may be 5,000 digits)."""
    return ascii(raw) if len(raw) <= 40 else ascii(raw[:40]) + f"... ({len(raw)} characters)"


# ASCII digits only: str.isdigit() and int() accept '²', '①', '١' (and int('²') raises), so
# neither decides what a number is here. A float is plain decimal notation (no '_', no
# 'inf' or 'nan', an exponent of at most 4 digits).
_INTEGER = re.compile(r"[0-9]+", re.ASCII)
_DECIMAL = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,4})?", re.ASCII)


def parse_number(
    env: Mapping[str, str],
    name: str,
    default: Any,
    low: float,
    high: float,
    *,
    integer: bool = True,
    percent: bool = False,
    low_open: bool = False,
    zero: bool = False,
    want: str = "",
    fallback: str = "",
) -> Any:
    """The one parser of every numeric setting: ``env[name]`` as a number in its bounds, or
    ``default`` (unset or blank: silently; a bad value: with one warning, once per process,
    naming the variable, the value and the fallback). Never raises.

    ``integer``: ASCII digits only; else plain decimal notation. ``low_open``: the low bound
    itself is refused (above 0). ``zero``: 0 is also accepted (off). ``percent``: a trailing
    ``%`` divides by 100. ``want`` and ``fallback`` word the warning.

    >>> parse_number({"N": "12"}, "N", 1, 1, 100)
    12
    """
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = _number(raw.strip(), high, integer=integer, percent=percent)
    if value is not None and ((zero and value == 0) or ((low < value if low_open else low <= value) and value <= high)):
        return value
    if not want:
        kind = "an integer" if integer else "a number"
        span = f"above {_plain(low)}" if low_open else f"from {_plain(low)}"
        want = f"{kind} {span} {'and at most' if low_open else 'to'} {_plain(high)}" + (" (or 0: off)" if zero else "")
    _bad(name, raw, f"{name}={_shown(raw)} is not {want}; using {fallback or default}")
    return default


def _plain(x: float) -> str:
    """A bound as a warning writes it: 10000000, 86400, 1e-06."""
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _number(text: str, high: float, *, integer: bool, percent: bool) -> int | float | None:
    """``text`` as a number, or None when it is not one in this notation (never raises)."""
    if percent and text.endswith("%"):
        inner = _number(text[:-1].strip(), high * 100, integer=False, percent=False)
        return None if inner is None else inner / 100
    if integer:
        if not _INTEGER.fullmatch(text):
            return None
        digits = text.lstrip("0") or "0"
        # A digit more than the bound has cannot be in bounds: int() is never asked to
        # convert 5,000 digits (Python refuses past 4,300, and it costs quadratic time).
        if len(digits) > len(str(int(high))):
            return None
        return int(digits)
    if len(text) > 64 or not _DECIMAL.fullmatch(text):
        return None
    try:
        value = float(text)
    except (ValueError, OverflowError):
        return None
    return value if math.isfinite(value) else None


def _positive_int(env: Mapping[str, str], name: str, default: int, maximum: int) -> int:
    return int(parse_number(env, name, default, 1, maximum))


def _count(env: Mapping[str, str], name: str, maximum: int) -> int:
    """An integer from 0 (off, the default) to ``maximum``."""
    return int(parse_number(env, name, 0, 0, maximum, want=f"an integer from 0 (off) to {maximum}", fallback="0 (off)"))


def _positive_float(env: Mapping[str, str], name: str, default: float, maximum: float) -> float:
    return float(parse_number(env, name, default, 0, maximum, integer=False, low_open=True))


BUDGET_MIN = 1e-6  # the smallest budget share (0.0001 %): below it the interval's arithmetic overflows


def _budget(env: Mapping[str, str], name: str) -> float:
    """A share of the step time: ``3%`` or ``0.03``, from 0.0001 % to 100 %; 0 (off) when unset."""
    return float(
        parse_number(
            env, name, 0.0, BUDGET_MIN, 1, integer=False, percent=True, zero=True,
            want="a share of the step time (3% or 0.03, 0.0001% to 100%)",
            fallback="0 (off: every step traced)",
        )
    )  # fmt: skip


# The largest rank a trace may name: the viewer refuses any integer in a record beyond
# +-2^63 (viewers/limits.py MAX_INT), so a larger one would make the whole header unreadable.
MAX_RANK = 2**63
RANK_VARIABLES = ("SPECTRACE_RANK", "RANK")


def env_rank(env: Mapping[str, str]) -> int | None:
    """The rank from ``SPECTRACE_RANK``, else ``RANK``: an integer from 0 to 2^63, or None.

    A bad value warns once, naming what is used instead (the next variable's rank, or no
    rank), and never raises."""
    bad: list[str] = []
    rank: int | None = None
    fallback = "no rank"
    for name in RANK_VARIABLES:
        raw = env.get(name)
        if raw is None or raw.strip() == "":
            continue
        value = _number(raw.strip(), MAX_RANK, integer=True, percent=False)
        if value is not None and value <= MAX_RANK:
            rank, fallback = int(value), f"{value} (from {name})"
            break
        bad.append(name)
    for name in bad:
        raw = env.get(name, "")
        _bad(name, raw, f"{name}={_shown(raw)} is not a rank (an integer from 0 to 2^63); using {fallback}")
    return rank


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


def control_path(env: Mapping[str, str] | None = None) -> str:
    """``SPECTRACE_CONTROL``: the file that pauses per-step work (control.py reads it), or ""."""
    env = os.environ if env is None else env
    return env.get("SPECTRACE_CONTROL", "").strip()


def fingerprint_path(env: Mapping[str, str] | None = None) -> str:
    """``SPECTRACE_FINGERPRINT``: the training fingerprint to compare with (checks/live.py), or ""."""
    env = os.environ if env is None else env
    return env.get("SPECTRACE_FINGERPRINT", "").strip()


# The process environment's SPECTRACE_FUSED_STATS, parsed once (see fused_stats_on).
_fused_stats: list[bool] = []


def fused_stats_on(env: Mapping[str, str] | None = None) -> bool:
    """``SPECTRACE_FUSED_STATS``: whether the fused Triton statistics kernels may be used.

    The process environment's value is parsed once, here: :meth:`Settings.from_env` and
    the eager and in-graph kernels (hooks/fused_stats.py, hooks/graph_slots.py, each at its
    first use) read that one answer. Another mapping (a test's) is parsed as given."""
    if env is not None and env is not os.environ:
        return _flag(env, "SPECTRACE_FUSED_STATS", True)
    if not _fused_stats:
        _fused_stats.append(_flag(os.environ, "SPECTRACE_FUSED_STATS", True))
    return _fused_stats[0]


def _metrics_port(env: Mapping[str, str]) -> dict[str, Any]:
    """``SPECTRACE_METRICS_PORT``: ``PORT`` (on 127.0.0.1) or ``ADDRESS:PORT``; 0 or unset: off."""
    raw = env.get("SPECTRACE_METRICS_PORT", "").strip()
    address, sep, port = raw.rpartition(":")
    address = address.strip("[] ") if sep else ""
    name = "SPECTRACE_METRICS_PORT"
    number = int(parse_number({name: port}, name, 0, 1, 65535, zero=True, fallback="0 (off)")) if port else 0
    return {"metrics_port": number, "metrics_address": address or "127.0.0.1"}


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
    max_file_mb: int = DEFAULT_MAX_FILE_MB  # 0: no cap on the trace file's size
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
    # SPECTRACE_REPLAY / SPECTRACE_REPLAY_ROWS: the draft's inputs and module outputs of a few
    # forwards kept beside the trace for `spectrace replay` (tensor values: user data, off).
    replay: bool = False
    replay_rows: int = 8
    # SPECTRACE_RANK, else RANK: the rank in the trace's name and header (None: no rank).
    rank: int | None = None
    fused_stats: bool = True  # SPECTRACE_FUSED_STATS: the fused Triton statistics kernels on GPUs
    # SPECTRACE_METRICS_PORT=[ADDRESS:]PORT: Prometheus metrics served from the process (0: off).
    metrics_port: int = 0
    metrics_address: str = "127.0.0.1"

    def __post_init__(self) -> None:
        # Settings built in code get the bounds the environment gets (a deque of 10^20 raises).
        bounds = (
            ("record_cap", 1, MAX_RECORD_CAP),
            ("sample", 1, MAX_SAMPLE),
            ("graph_sample", 1, MAX_SAMPLE),
            ("max_file_mb", 0, MAX_FILE_MB),
        )
        for name, low, high in bounds:
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
        rank = self.rank
        if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank <= MAX_RANK):
            _bad("rank", repr(rank), f"Settings(rank={rank!r}) is not None or an integer from 0 to 2^63; using None")
            object.__setattr__(self, "rank", None)
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
        replay = _flag(env, "SPECTRACE_REPLAY", False)
        if replay:
            _bad(
                "SPECTRACE_REPLAY",
                "1",
                "SPECTRACE_REPLAY=1: the draft's inputs and module outputs of a few forwards are written beside the "
                "trace (*.replay.safetensors) for `spectrace replay`; they are user data, keep them private",
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
            max_file_mb=int(parse_number(env, "SPECTRACE_MAX_FILE_MB", DEFAULT_MAX_FILE_MB, 1, MAX_FILE_MB, zero=True)),
            flush_seconds=_positive_float(env, "SPECTRACE_FLUSH_SECONDS", DEFAULT_FLUSH_SECONDS, MAX_FLUSH_SECONDS),
            token_stats=_flag(env, "SPECTRACE_TOKEN_STATS", False),
            keep_argv=keep_argv,
            quiet=_flag(env, "SPECTRACE_QUIET", False),
            sglang_skip=_patterns(env, "SPECTRACE_SGLANG_SKIP"),
            sglang_layers=_choice(env, "SPECTRACE_SGLANG_LAYERS", ("captured", "all"), "captured"),
            graph_sample=_positive_int(env, "SPECTRACE_GRAPH_SAMPLE", 64, MAX_SAMPLE),
            fingerprint=fingerprint_path(env),
            control=control_path(env),
            capture_values=capture_values,
            replay=replay,
            replay_rows=_positive_int(env, "SPECTRACE_REPLAY_ROWS", 8, 256),
            rank=env_rank(env),
            fused_stats=fused_stats_on(env),
            **_metrics_port(env),
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
