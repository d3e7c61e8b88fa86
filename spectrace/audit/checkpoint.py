"""Read a draft checkpoint without trusting it: config.json and tensor names/shapes only.

Safetensors headers are parsed by hand with bounded reads, so a header that claims
gigabytes is refused before anything is allocated, and no tensor data is ever read.
A ``.bin`` goes through ``torch.load(weights_only=True)`` only: a pickle that would run
code is refused by torch, not executed. Every unusable input raises
:class:`AuditInputError` with a one-line message.

    >>> ckpt = read_checkpoint(Path("tests/fixtures/speculators_tiny"))
    >>> ckpt.config.format, ckpt.tensors["fc.weight"].shape
    ('speculators', [64, 192])
"""

from __future__ import annotations

import json
import math
import struct
import warnings
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from ..rules.readings import SPECULATORS_FLAGS, Reading, provenance, speculators_traces

# The safetensors library refuses headers above 100 MB; a real header is a few KB per
# hundred tensors, so anything larger is corrupt or hostile.
MAX_HEADER_BYTES = 100_000_000
MAX_CONFIG_BYTES = 16 * 1024 * 1024
# A legacy (non-zip) .bin cannot be memory-mapped and would be read whole.
MAX_LEGACY_BIN_BYTES = 1 << 30
# Plausibility bounds: the checks walk layer indices, so a config claiming 10**12 layers
# would keep the audit busy for hours. Real drafts have 1-2 layers, targets at most a few
# hundred; sizes fit in 32 bits.
MAX_LAYERS = 10_000
MAX_CONFIG_INT = 2**31 - 1

DTYPE_BYTES: dict[str, float] = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "F4": 0.5, "F6_E2M3": 0.75,
    "F6_E3M2": 0.75, "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8, "C64": 8,
}  # fmt: skip

Format = Literal["speculators", "sglang", "unknown"]
# One list of speculators-only keys for the audit and the runtime checks alike.
FLAG_KEYS = SPECULATORS_FLAGS


class AuditInputError(Exception):
    """An input the audit cannot use; ``str(err)`` is one line meant for the user."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


class TensorInfo(BaseModel):
    shape: list[int]
    dtype: str
    file: str


class DraftConfigFile(BaseModel):
    """The fields of a draft config.json that decide how an engine loads and feeds it."""

    format: Format
    architectures: list[str] = []
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    num_hidden_layers: int = 1
    draft_vocab_size: int | None = None
    target_hidden_size: int | None = None
    tie_word_embeddings: bool = False
    fc_bias: bool = Field(False, description="config.bias: SGLang gives fc a bias when set")
    top_level_ids: list[int] | None = Field(None, description="eagle_aux_hidden_state_layer_ids at the top level")
    eagle_config_ids: list[int] | None = Field(None, description="eagle_config.eagle_aux_hidden_state_layer_ids")
    use_aux_hidden_state: bool | None = None
    flags: dict[str, bool] = {}
    speculators_traces: list[str] = []
    null_keys: list[str] = Field(
        default=[], description="keys written as null that an engine reads with hasattr (so None is taken as the value)"
    )
    stated: Reading | None = Field(
        None, description="what the config states it was trained on (trainer_convention + trained_aux_boundaries or ids)"
    )


class TargetConfig(BaseModel):
    architectures: list[str] = []
    model_type: str = ""
    num_hidden_layers: int
    hidden_size: int
    vocab_size: int | None = None
    path: str = ""


class DraftCheckpoint(BaseModel):
    path: str
    config: DraftConfigFile
    tensors: dict[str, TensorInfo]
    files: list[str]


# ---------------------------------------------------------------- config.json


def read_json(path: Path, what: str) -> dict[str, Any]:
    """Read a small JSON object; refuse missing, huge, non-UTF-8, non-JSON or non-object files."""
    if not path.is_file():
        raise AuditInputError(f"{what}: {path} not found")
    size = path.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise AuditInputError(f"{what}: {path} is {size} bytes; a config is at most {MAX_CONFIG_BYTES}")
    try:
        with path.open("rb") as f:
            text = f.read(MAX_CONFIG_BYTES + 1).decode("utf-8")
        data = json.loads(text)
    except UnicodeDecodeError:
        raise AuditInputError(f"{what}: {path} is not UTF-8 text") from None
    except json.JSONDecodeError as err:
        raise AuditInputError(f"{what}: {path} is not JSON ({err.msg} at line {err.lineno} column {err.colno})") from None
    except RecursionError:
        raise AuditInputError(f"{what}: {path} nests too deeply to be a config") from None
    if not isinstance(data, dict):
        raise AuditInputError(f"{what}: {path} holds a JSON {type(data).__name__}, not an object")
    return data


def _get(d: dict[str, Any], key: str, kind: str, where: str, default: Any = None) -> Any:
    """Fetch ``d[key]`` checked against ``kind``; JSON has no int/bool distinction in Python, so check both."""
    if key not in d or d[key] is None:
        return default
    value = d[key]
    ok = {
        "int": isinstance(value, int) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
        "ids": isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in value),
        "strs": isinstance(value, list) and all(isinstance(i, str) for i in value),
        "dict": isinstance(value, dict),
        "str": isinstance(value, str),
    }[kind]
    if not ok:
        want = {"ids": "a list of integers", "strs": "a list of strings", "dict": "an object"}.get(kind, f"a {kind}")
        raise AuditInputError(f"config.json: {where}{key} must be {want}, got {json.dumps(value)[:60]}")
    if kind == "int" and value < 0:
        raise AuditInputError(f"config.json: {where}{key} must not be negative, got {value}")
    limit = MAX_LAYERS if key == "num_hidden_layers" else MAX_CONFIG_INT
    if kind == "int" and value > limit:
        raise AuditInputError(f"config.json: {where}{key} = {str(value)[:24]} is implausibly large (limit {limit})")
    if kind == "ids" and any(abs(i) > MAX_LAYERS for i in value):
        raise AuditInputError(f"config.json: {where}{key} holds a layer id beyond ±{MAX_LAYERS}, got {json.dumps(value)[:60]}")
    return value


def _require(d: dict[str, Any], key: str, where: str) -> int:
    value = _get(d, key, "int", where)
    if value is None:
        raise AuditInputError(f"config.json: {where}{key} is missing")
    if value == 0:
        raise AuditInputError(f"config.json: {where}{key} must be positive")
    return value


# SGLang's draft class takes config.target_hidden_size as fc's input size whenever the
# attribute exists (hasattr), so a null left by a conversion is used as a size.
NULL_SENSITIVE_KEYS = ("target_hidden_size",)


def parse_draft_config(raw: dict[str, Any]) -> DraftConfigFile:
    """Normalise a SpecForge/SGLang-format or speculators-format draft config."""
    traces = speculators_traces(raw)
    if "transformer_layer_config" in raw:
        layer = _get(raw, "transformer_layer_config", "dict", "")
        if layer is None:  # present but null: _get treats it as absent
            raise AuditInputError("config.json: transformer_layer_config must be an object, got null")
        where = "transformer_layer_config."
        fmt: Format = "speculators"
    else:
        layer, where = raw, ""
        fmt = "sglang" if ("eagle_config" in raw or "speculators_model_type" not in raw) else "unknown"
    if "speculators_model_type" in raw and _get(raw, "speculators_model_type", "str", "") != "eagle3":
        raise AuditInputError(f"config.json: speculators_model_type is {raw['speculators_model_type']!r}, not 'eagle3'")
    hidden = _require(layer, "hidden_size", where)
    heads = _require(layer, "num_attention_heads", where)
    eagle = _get(raw, "eagle_config", "dict", "", {})
    flags = {k: _get(raw, k, "bool", "", False) for k in FLAG_KEYS if k in raw}
    return DraftConfigFile(
        format=fmt,
        architectures=_get(raw, "architectures", "strs", "", []),
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=_get(layer, "num_key_value_heads", "int", where, heads),
        head_dim=_get(layer, "head_dim", "int", where, hidden // heads),
        intermediate_size=_require(layer, "intermediate_size", where),
        vocab_size=_require(layer, "vocab_size", where),
        num_hidden_layers=_get(layer, "num_hidden_layers", "int", where, 1),
        draft_vocab_size=_get(raw, "draft_vocab_size", "int", ""),
        target_hidden_size=_get(raw, "target_hidden_size", "int", ""),
        tie_word_embeddings=_get(raw, "tie_word_embeddings", "bool", "", False) or _get(layer, "tie_word_embeddings", "bool", where, False),
        fc_bias=_get(raw, "bias", "bool", "", False),
        top_level_ids=_get(raw, "eagle_aux_hidden_state_layer_ids", "ids", ""),
        eagle_config_ids=_get(eagle, "eagle_aux_hidden_state_layer_ids", "ids", "eagle_config."),
        use_aux_hidden_state=_get(eagle, "use_aux_hidden_state", "bool", "eagle_config."),
        flags=flags,
        speculators_traces=traces,
        stated=_stated(raw),
        null_keys=[key for key in NULL_SENSITIVE_KEYS if key in raw and raw[key] is None],
    )


def _stated(raw: dict[str, Any]) -> Reading | None:
    """The training provenance stamped in the config, its values checked like the rest."""
    for key in ("trained_aux_boundaries", "trained_aux_layer_ids"):
        _get(raw, key, "ids", "")
    _get(raw, "trainer_convention", "str", "")
    return provenance(raw)


def read_target_config(path: Path) -> TargetConfig:
    """The target's layer count, width and vocab (multimodal configs: their text_config)."""
    p = path / "config.json" if path.is_dir() else path
    raw = read_json(p, "target config")
    text = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw
    where = "text_config." if text is not raw else ""
    try:
        return TargetConfig(
            architectures=_get(raw, "architectures", "strs", "", []),
            model_type=_get(text, "model_type", "str", where, "") or _get(raw, "model_type", "str", "", ""),
            num_hidden_layers=_require(text, "num_hidden_layers", where),
            hidden_size=_require(text, "hidden_size", where),
            vocab_size=_get(text, "vocab_size", "int", where),
            path=str(p),
        )
    except AuditInputError as err:
        raise AuditInputError(str(err).replace("config.json:", f"target config {p}:", 1)) from None


# ---------------------------------------------------------------- tensors


def read_safetensors_header(path: Path) -> dict[str, TensorInfo]:
    """Names, shapes and dtypes from a safetensors header, checked against the file size."""
    size = path.stat().st_size
    if size < 8:
        raise AuditInputError(f"{path.name}: {size} bytes, too short to be safetensors")
    with path.open("rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > MAX_HEADER_BYTES:
            raise AuditInputError(f"{path.name}: header length claims {n} bytes (limit {MAX_HEADER_BYTES}); corrupt or hostile file")
        if n > size - 8:
            raise AuditInputError(f"{path.name}: header length {n} exceeds the file ({size} bytes); truncated or corrupt")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise AuditInputError(f"{path.name}: header is not valid JSON; corrupt safetensors") from None
    if not isinstance(header, dict):
        raise AuditInputError(f"{path.name}: header is not a JSON object; corrupt safetensors")
    data_bytes = size - 8 - n
    out: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        out[name] = _check_entry(path.name, name, entry, data_bytes)
    return out


def _check_entry(file: str, name: str, entry: Any, data_bytes: int) -> TensorInfo:
    bad = f"{file}: tensor {name!r}"
    if not isinstance(entry, dict):
        raise AuditInputError(f"{bad} has no header entry object; corrupt safetensors")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in DTYPE_BYTES:
        raise AuditInputError(f"{bad} has unknown dtype {str(dtype)[:20]!r}; corrupt safetensors")
    if not (isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
        raise AuditInputError(f"{bad} has an invalid shape; corrupt safetensors")
    if not (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
        and 0 <= offsets[0] <= offsets[1]
    ):
        raise AuditInputError(f"{bad} has invalid data_offsets; corrupt safetensors")
    if offsets[1] > data_bytes:
        raise AuditInputError(f"{bad} ends at byte {offsets[1]} but the file holds {data_bytes}; truncated")
    if math.ceil(math.prod(shape) * DTYPE_BYTES[dtype]) != offsets[1] - offsets[0]:
        raise AuditInputError(f"{bad}: shape {shape} {dtype} does not match its {offsets[1] - offsets[0]} bytes; corrupt")
    return TensorInfo(shape=list(shape), dtype=dtype, file=file)


def read_torch_bin(path: Path) -> dict[str, TensorInfo]:
    """A pickled state dict, through the weights-only unpickler (no code runs)."""
    import pickle

    import torch

    size = path.stat().st_size
    try:
        # torch warns on stderr about pickle protocols; the audit's stderr is its one error line.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                # mmap keeps a large zip checkpoint on disk: only the pickle is read.
                obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as err:
                if "mmap" not in str(err) and "zip" not in str(err):
                    raise
                if size > MAX_LEGACY_BIN_BYTES:
                    raise AuditInputError(f"{path.name}: legacy (non-zip) torch file of {size} bytes; refusing to read it whole") from None
                obj = torch.load(path, map_location="cpu", weights_only=True)
    except AuditInputError:
        raise
    except pickle.UnpicklingError as err:
        raise AuditInputError(f"{path.name}: refused by torch's weights-only loader ({_why_refused(str(err))})") from None
    except Exception as err:  # noqa: BLE001 - any failure of an untrusted file is an input error
        raise AuditInputError(f"{path.name}: not a readable torch checkpoint ({type(err).__name__})") from None
    if isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict):
        obj = obj["state_dict"]
    if not isinstance(obj, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()):
        raise AuditInputError(f"{path.name}: not a state dict of named tensors")
    return {k: TensorInfo(shape=list(v.shape), dtype=str(v.dtype).removeprefix("torch."), file=path.name) for k, v in obj.items()}


def _why_refused(text: str) -> str:
    """The line of torch's long refusal that names the offending global or opcode."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in lines:
        if ln.startswith(("WeightsUnpickler error:", "Unsupported")):
            return ln.removeprefix("WeightsUnpickler error:").strip()[:160]
    return (lines[0] if lines else "unpickling refused")[:160]


def weight_files(root: Path) -> list[Path]:
    """The files an engine would load: safetensors when present, else torch pickles."""
    st = sorted(p for p in root.glob("*.safetensors") if p.is_file())
    if st:
        return st
    return sorted(p for p in root.iterdir() if p.is_file() and p.suffix in (".bin", ".pt", ".pth"))


def read_tensors(root: Path) -> tuple[dict[str, TensorInfo], list[str]]:
    files = weight_files(root)
    if not files:
        raise AuditInputError(f"{root}: no weight files (*.safetensors or *.bin)")
    tensors: dict[str, TensorInfo] = {}
    for f in files:
        got = read_safetensors_header(f) if f.suffix == ".safetensors" else read_torch_bin(f)
        for name, info in got.items():
            if name in tensors:
                raise AuditInputError(f"tensor {name!r} appears in both {tensors[name].file} and {f.name}")
            tensors[name] = info
    return tensors, [f.name for f in files]


def read_checkpoint(path: Path) -> DraftCheckpoint:
    """Config and tensor inventory of a draft checkpoint directory."""
    if not path.exists():
        raise AuditInputError(f"{path}: no such directory")
    if not path.is_dir():
        raise AuditInputError(f"{path}: not a directory (pass the draft checkpoint directory)")
    config = parse_draft_config(read_json(path / "config.json", "draft config"))
    tensors, files = read_tensors(path)
    return DraftCheckpoint(path=str(path), config=config, tensors=tensors, files=files)
