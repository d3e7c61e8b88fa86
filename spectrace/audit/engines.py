"""The engine models moved to :mod:`spectrace.rules.engines` (release knowledge, torch-free,
read by the checks); this name stays for the audit command's imports until they read it there."""

from __future__ import annotations

from ..rules.engines import SGLANG_0523, SGLANG_OLDER, VLLM, Dims, Engine, Param, Route, dims_of, get_engine, parse_engine

__all__ = ["SGLANG_0523", "SGLANG_OLDER", "VLLM", "Dims", "Engine", "Param", "Route", "dims_of", "get_engine", "parse_engine"]
