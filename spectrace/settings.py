"""One validated settings object read from ``SPECTRACE_*`` variables.

A bad value never raises: it prints one warning naming the variable and the fallback.

    >>> settings = Settings.from_env()
    >>> settings.stats
    'basic'
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

StatsMode = Literal["off", "basic", "full"]
STATS_MODES = ("off", "basic", "full")

DEFAULT_RECORD_CAP = 100_000
DEFAULT_FLUSH_SECONDS = 2.0


def warn(message: str) -> None:
    """Print one spectrace warning line to stderr (never raises)."""
    try:
        sys.stderr.write(f"spectrace: warning: {message}\n")
    except Exception:  # a closed stderr must not break the host
        pass


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
    warn(f"{name}={raw!r} is not a boolean (1/0/true/false); using {int(default)}")
    return default


def _positive_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
        if value < 1:
            raise ValueError
        return value
    except ValueError:
        warn(f"{name}={raw!r} is not a positive integer; using {default}")
        return default


def _positive_float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
        if not value > 0:
            raise ValueError
        return value
    except ValueError:
        warn(f"{name}={raw!r} is not a positive number; using {default}")
        return default


def _choice(env: Mapping[str, str], name: str, choices: tuple[str, ...], default: str) -> str:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value not in choices:
        warn(f"{name}={raw!r} is not one of {', '.join(choices)}; using {default!r}")
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
    record_cap: int = DEFAULT_RECORD_CAP
    flush_seconds: float = DEFAULT_FLUSH_SECONDS
    keep_argv: bool = False  # the header keeps the command line's option values
    quiet: bool = False
    otlp_endpoint: str = ""  # the OTEL_EXPORTER_OTLP(_TRACES)_ENDPOINT in effect: turns spans on
    sglang_skip: tuple[str, ...] = ()  # SGLang patch-point features left unpatched (reported once)
    sglang_layers: str = "captured"  # target layers hooked in SGLang: those the draft reads (+ the last), or "all"
    graph_sample: int = 64  # in-graph statistics read back after 1 in N replays of each captured graph
    fingerprint: str = ""  # a training fingerprint (spectrace fingerprint) to compare the live draft input with
    control: str = ""  # a file whose first word ("off"/"on") pauses or resumes per-step work at run time

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        stats = _choice(env, "SPECTRACE_STATS", STATS_MODES, "basic")
        keep_argv = _flag(env, "SPECTRACE_KEEP_ARGV", False)
        if keep_argv:
            warn("SPECTRACE_KEEP_ARGV=1: trace headers keep the full command line (prompts, tokens, paths); keep them private")
        if "SPECTRACE_CAPTURE_VALUES" in env:
            # Its name promised tensor values; all it ever did was keep the command line.
            warn(
                "SPECTRACE_CAPTURE_VALUES is gone and has no effect: traces never hold tensor values; "
                "SPECTRACE_KEEP_ARGV=1 keeps the full command line in the header"
            )
        return cls(
            enabled=_flag(env, "SPECTRACE", False),
            dir=env.get("SPECTRACE_DIR", "").strip() or "spectrace-traces",
            modules=_patterns(env, "SPECTRACE_MODULES"),
            profile=env.get("SPECTRACE_PROFILE", "").strip(),
            stats=stats,  # type: ignore[arg-type]
            sample=_positive_int(env, "SPECTRACE_SAMPLE", 1),
            record_cap=_positive_int(env, "SPECTRACE_RECORD_CAP", DEFAULT_RECORD_CAP),
            flush_seconds=_positive_float(env, "SPECTRACE_FLUSH_SECONDS", DEFAULT_FLUSH_SECONDS),
            keep_argv=keep_argv,
            quiet=_flag(env, "SPECTRACE_QUIET", False),
            sglang_skip=_patterns(env, "SPECTRACE_SGLANG_SKIP"),
            sglang_layers=_choice(env, "SPECTRACE_SGLANG_LAYERS", ("captured", "all"), "captured"),
            graph_sample=_positive_int(env, "SPECTRACE_GRAPH_SAMPLE", 64),
            fingerprint=env.get("SPECTRACE_FINGERPRINT", "").strip(),
            control=env.get("SPECTRACE_CONTROL", "").strip(),
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

    def describe(self) -> str:
        """The settings in effect, one per line (``spectrace settings``)."""
        return "\n".join(f"{k} = {v!r}" for k, v in self.as_dict().items())
