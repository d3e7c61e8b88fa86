"""What both engines' doctor runs share: the tiny checkpoint, the reads a class makes, the facts.

Torch is imported here; no engine is.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from .facts import Rotary

# Fused parameters the engines' linear layers hold, and the checkpoint's parts of each.
_FUSED = {
    "q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj",
    "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj",
    "q_a_proj": "fused_qkv_a_proj_with_mqa", "kv_a_proj_with_mqa": "fused_qkv_a_proj_with_mqa",
}  # fmt: skip


# ------------------------------------------------------------------ the tiny checkpoint
def _param_shapes(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    return {name: tuple(p.shape) for name, p in model.named_parameters()}


def _part_rows(part: str, cfg: Any, fused_rows: int) -> int:
    """The rows of one checkpoint part of a fused parameter of ``fused_rows`` rows."""
    heads, kv = cfg.num_attention_heads, getattr(cfg, "num_key_value_heads", cfg.num_attention_heads)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    rows = {
        "q_proj": heads * head_dim,
        "k_proj": kv * head_dim,
        "v_proj": kv * head_dim,
        "gate_proj": fused_rows // 2,
        "up_proj": fused_rows // 2,
        "q_a_proj": getattr(cfg, "q_lora_rank", None) or 0,
        "kv_a_proj_with_mqa": (getattr(cfg, "kv_lora_rank", 0) or 0) + (getattr(cfg, "qk_rope_head_dim", 0) or 0),
    }
    return rows[part]


def _engine_name(name: str) -> list[str]:
    """The parameter names of SGLang's draft a checkpoint name may land in (shapes only: what the
    loader really does with the name is the loader's business)."""
    body = name.replace("midlayer.", "layers.0.")
    return [body, f"model.{body}", body.removeprefix("model.")]


def tiny_shape(
    name: str, full_shape: Sequence[int], params: Mapping[str, tuple[int, ...]], cfg: Any, widths: Mapping[int, int]
) -> tuple[int, ...]:
    """The tiny shape of the checkpoint tensor ``name``: the shape of the engine parameter it
    fills (its part of a fused one), else its full shape with each width shrunk."""
    parts = name.split(".")
    leaf = parts[-2] if len(parts) >= 2 else ""
    for candidate in _engine_name(name):
        if candidate in params:
            return params[candidate]
        fused = _FUSED.get(leaf)
        if fused is not None:
            joined = candidate.replace(f".{leaf}.", f".{fused}.")
            if joined in params:
                shape = params[joined]
                return (_part_rows(leaf, cfg, shape[0]), *shape[1:]) if len(shape) > 1 else (_part_rows(leaf, cfg, shape[0]),)
    return tuple(widths.get(int(d), int(d)) for d in full_shape)


_FLOAT = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"}


def write_tiny_checkpoint(
    folder: Path, tensors: Mapping[str, Any], maps: Any, probe: torch.nn.Module, cfg: Any, widths: Mapping[int, int]
) -> None:
    """``model.safetensors`` in ``folder``: every tensor of the user's checkpoint, named as it
    names it, at its tiny shape, random; the vocabulary maps with their real values."""
    from safetensors.torch import save_file

    params = _param_shapes(probe)
    g = torch.Generator().manual_seed(0)
    out: dict[str, torch.Tensor] = {}
    for name, info in tensors.items():
        which = name.rsplit(".", 1)[-1]
        if which == "d2t" and maps.d2t is not None:
            out[name] = torch.tensor(maps.d2t, dtype=torch.int64)
            continue
        if which == "t2d" and maps.t2d is not None:
            out[name] = torch.tensor(maps.t2d, dtype=torch.bool)
            continue
        shape = tiny_shape(name, info.shape, params, cfg, widths)
        if info.dtype in _FLOAT:
            fill = torch.ones(shape) if "norm" in name else torch.randn(shape, generator=g) * 0.02
            out[name] = fill.float()
        elif info.dtype == "BOOL":
            out[name] = torch.ones(shape, dtype=torch.bool)
        else:
            out[name] = torch.zeros(shape, dtype=torch.int64)
    save_file(out, str(folder / "model.safetensors"))


# ------------------------------------------------------------------ what the class reads
class _ReadLog:
    """The config keys a class read (attribute, or a key of a dict the config holds)."""

    def __init__(self, watched: set[str]) -> None:
        self.watched = watched
        self.read: set[str] = set()


class _WatchedDict(dict):  # type: ignore[type-arg]
    log: _ReadLog

    def get(self, key: Any, default: Any = None) -> Any:
        self._note(key)
        return super().get(key, default)

    def __getitem__(self, key: Any) -> Any:
        self._note(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self._note(key)
        return super().__contains__(key)

    def _note(self, key: object) -> None:
        if isinstance(key, str) and key in self.log.watched:
            self.log.read.add(key)


def watch_reads(config: Any, watched: set[str]) -> _ReadLog:
    """Note every read of a ``watched`` key on ``config`` from now on (its class swapped for a
    subclass that notes, its ``eagle_config`` dict for one that notes)."""
    log = _ReadLog(watched)
    base: Any = type(config)

    def __getattribute__(self: Any, key: str) -> Any:
        if key in watched:
            log.read.add(key)
        return base.__getattribute__(self, key)

    config.__class__ = type(base.__name__, (base,), {"__getattribute__": __getattribute__})
    for key in ("eagle_config",):
        value = base.__getattribute__(config, key) if hasattr(config, key) else None
        if isinstance(value, dict):
            watched_dict = _WatchedDict(value)
            watched_dict.log = log
            setattr(config, key, watched_dict)
    return log


@contextlib.contextmanager
def quiet() -> Iterator[list[str]]:
    """The engine's own logging and progress bars go to a file; its last lines are kept for an error."""
    lines: list[str] = []
    with tempfile.TemporaryFile(mode="w+") as sink:
        saved = os.dup(1), os.dup(2)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            yield lines
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
            sink.seek(0)
            lines.extend(sink.read().splitlines()[-20:])


def rotaries(model: Any) -> list[Rotary]:
    from ..integrations.core.rotary import live_rotaries

    return [Rotary(module=r.module, cls=r.cls, base=r.base, rope_type=r.rope_type, factor=r.factor, rotary_dim=r.rotary_dim, neox=r.neox)
            for r in live_rotaries(model)]  # fmt: skip


def fc_in(draft: Any) -> int | None:
    """The width the draft's fc reads (its declared input size: a CPU build may repack the weight)."""
    for name, module in draft.named_modules():
        if name.endswith("fc") and hasattr(module, "weight"):
            size = getattr(module, "input_size", None)
            return int(size) if isinstance(size, int) else int(module.weight.shape[-1])
    return None


class EngineRunError(Exception):
    """The engine failed on the shrunk pair (what a server would fail on at start, or a limit of the CPU run)."""

    def __init__(self, message: str, engine_log: list[str]) -> None:
        super().__init__(message)
        self.engine_log = engine_log


def flag_set(config: Mapping[str, Any], key: str) -> bool:
    eagle = config.get("eagle_config")
    tlc = config.get("transformer_layer_config")
    return any(isinstance(d, dict) and key in d for d in (config, eagle, tlc))


@contextlib.contextmanager
def tiny_folders(tiny_target: Mapping[str, Any], tiny_draft: Mapping[str, Any]) -> Iterator[tuple[Path, Path]]:
    """A temporary ``target/`` and ``draft/`` folder, each holding its shrunk config.json, for
    the engine's own config loading; gone afterwards."""
    with tempfile.TemporaryDirectory(prefix="spectrace-doctor-") as tmp:
        tdir, ddir = Path(tmp, "target"), Path(tmp, "draft")
        tdir.mkdir()
        ddir.mkdir()
        (tdir / "config.json").write_text(json.dumps(tiny_target))
        (ddir / "config.json").write_text(json.dumps(tiny_draft))
        yield tdir, ddir
