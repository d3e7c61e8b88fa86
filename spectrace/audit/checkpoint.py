"""Read a draft checkpoint without trusting it: config.json and tensor names/shapes only.

Safetensors headers are parsed by hand with bounded reads, so a header that claims
gigabytes is refused before anything is allocated. The only tensor data ever read are
the vocabulary maps ``d2t`` and ``t2d`` (:func:`read_vocab_maps`): integers, read within
the byte range their header entry was checked to occupy, and only up to
:data:`MAX_MAP_ENTRIES` entries.
A ``.bin`` goes through ``torch.load(weights_only=True)`` only: a pickle that would run
code is refused by torch, not executed; a zip ``.bin`` is memory-mapped, and its pickle
and other records are size-checked in the zip directory before torch inflates any of
them. Every unusable input raises :class:`AuditInputError` with a one-line message.

The work is bounded by the size of what is read: integers are at most
:data:`MAX_INT_DIGITS` digits, shapes at most :data:`MAX_SHAPE_RANK` dimensions, id
lists at most :data:`MAX_AUX_IDS` entries. Files must resolve inside the checkpoint
folder (a link out of it is refused unread), and an error never quotes bytes of a file
that has not parsed as what it claims to be.

    >>> ckpt = read_checkpoint(Path("tests/fixtures/speculators_tiny"))
    >>> ckpt.config.format, ckpt.tensors["fc.weight"].shape
    ('speculators', [64, 192])
"""

from __future__ import annotations

import errno
import json
import os
import re
import struct
import warnings
import zipfile
from pathlib import Path
from typing import Any

# The facts this reader produces are the checks' input models: they live with the checks,
# so a check never imports this reader (nor torch, which a .bin reaches).
from ..checks.facts import DraftCheckpoint, DraftConfigFile, Format, RopeKeys, TargetConfig, TensorInfo, VocabMaps
from ..rules.readings import SPECULATORS_FLAGS, Reading, provenance, speculators_traces
from ..safe_files import FileMissing, NotRegularFile, SafeFileError, open_regular

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

# A zip .bin's records other than tensor storages (data.pkl, version, byteorder...) are
# read into memory whole, and inflated first when compressed: each is capped like a
# safetensors header. Storages are memory-mapped, never inflated.
MAX_PICKLE_BYTES = MAX_HEADER_BYTES
# Every real integer in a config or header fits in 64 bits (20 digits); 10**40 must still
# reach the "implausibly large" check. Longer ones are refused while parsing: Python's
# int() is quadratic in the digits and refuses more than 4,300 anyway.
MAX_INT_DIGITS = 100
# Real tensors have a handful of dimensions; a shape of a million dims is an attack on
# the byte count.
MAX_SHAPE_RANK = 64
# An EAGLE-3 draft captures a few layers (3 by default); every message and reading
# lists them, so a list of 100,000 would be printed many times over.
MAX_AUX_IDS = 64

# The vocabulary maps are read by value: d2t has draft_vocab_size entries, t2d one per
# target token. Real vocabularies stay below ~300k; past this many entries the values
# are not read (the names and shapes are still checked).
MAX_MAP_ENTRIES = 1 << 22
# The integer dtypes a map is stored in, as (struct code, bytes per entry).
MAP_DTYPES: dict[str, tuple[str, int]] = {
    "BOOL": ("B", 1), "U8": ("B", 1), "I8": ("b", 1), "I16": ("h", 2), "U16": ("H", 2),
    "I32": ("i", 4), "U32": ("I", 4), "I64": ("q", 8), "U64": ("Q", 8),
}  # fmt: skip
# Config dicts of the rotary embedding are kept as written, bounded: so many keys, so
# long a string.
MAX_ROPE_KEYS = 64
MAX_ROPE_STRING = 64

# Bits per element, so sizes stay integers (F4 is half a byte; no float can overflow).
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8, "F4": 4, "F6_E2M3": 6,
    "F6_E3M2": 6, "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64, "C64": 64,
}  # fmt: skip
DTYPE_BYTES: dict[str, float] = {k: v / 8 for k, v in DTYPE_BITS.items()}

# One list of speculators-only keys for the audit and the runtime checks alike.
FLAG_KEYS = SPECULATORS_FLAGS


class AuditInputError(Exception):
    """An input the audit cannot use; ``str(err)`` is one line meant for the user."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


# ---------------------------------------------------------------- config.json


class _LongInteger(ValueError):
    """An integer literal of more than MAX_INT_DIGITS digits (raised from inside json.loads)."""


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _LongInteger(text)
    return int(text)


def loads_bounded(text: str | bytes) -> Any:
    """``json.loads`` that refuses integers longer than MAX_INT_DIGITS digits (``_LongInteger``)."""
    return json.loads(text, parse_int=_bounded_int)


# ---------------------------------------------------------------- the checkpoint folder


def allowed_roots(folder: Path) -> tuple[Path, ...]:
    """Where the files of ``folder`` may resolve: the folder itself, and for a Hugging Face
    cache snapshot (``.../snapshots/<rev>``, whose files link to ``../../blobs/<hash>``) that
    repository's blobs folder."""
    root = folder.resolve()
    if root.parent.name == "snapshots":
        return (root, root.parent.parent / "blobs")
    return (root,)


def _resolve(path: Path) -> Path:
    try:
        return path.resolve()
    except (OSError, RuntimeError):  # a link loop
        raise AuditInputError(f"{path.name}: a link that resolves nowhere (a loop)") from None


def contained(path: Path, folder: Path) -> Path:
    """``path`` resolved, refused unread when it leads out of ``folder`` (a planted link to
    /etc/passwd would otherwise have its first bytes quoted as a header length)."""
    real = _resolve(path)
    if not any(real.is_relative_to(root) for root in allowed_roots(folder)):
        raise AuditInputError(f"{path.name}: resolves outside the checkpoint folder; refusing to read it")
    return real


def _open_regular(path: Path) -> tuple[Any, int]:
    """Open a resolved path the way every untrusted file is opened (:func:`spectrace.safe_files.open_regular`:
    no link swapped in since is followed, and only a regular file: a FIFO or device would
    block or never end); returns (file, size)."""
    try:
        fd, size = open_regular(path)
    except NotRegularFile as err:
        if err.kind in ("a symbolic link", "a socket"):  # a link put at the name after it was resolved; a socket opens not at all
            code = errno.ELOOP if err.kind == "a symbolic link" else errno.ENXIO
            raise AuditInputError(f"{path.name}: cannot be opened ({os.strerror(code)})") from None
        raise AuditInputError(f"{path.name}: not a regular file") from None
    except FileMissing:
        raise AuditInputError(f"{path.name}: cannot be opened ({os.strerror(errno.ENOENT)})") from None
    except SafeFileError as err:
        cause = err.__context__  # the OSError, whose strerror names the reason without the full path
        why = getattr(cause, "strerror", None) or "unreadable"
        raise AuditInputError(f"{path.name}: cannot be opened ({why})") from None
    return os.fdopen(fd, "rb"), size


def read_json(path: Path, what: str, folder: Path | None = None) -> dict[str, Any]:
    """Read a small JSON object; refuse missing, huge, non-UTF-8, non-JSON or non-object files.

    ``folder``: the checkpoint folder ``path`` must resolve inside (None: a file the user
    named outright)."""
    if not path.is_file():
        raise AuditInputError(f"{what}: {path} not found")
    real = contained(path, folder) if folder is not None else _resolve(path)
    f, size = _open_regular(real)
    with f:
        if size > MAX_CONFIG_BYTES:
            raise AuditInputError(f"{what}: {path} is {size} bytes; a config is at most {MAX_CONFIG_BYTES}")
        blob = f.read(MAX_CONFIG_BYTES + 1)
    try:
        data = loads_bounded(blob.decode("utf-8"))
    except UnicodeDecodeError:
        raise AuditInputError(f"{what}: {path} is not UTF-8 text") from None
    except json.JSONDecodeError as err:
        raise AuditInputError(f"{what}: {path} is not JSON ({err.msg} at line {err.lineno} column {err.colno})") from None
    except RecursionError:
        raise AuditInputError(f"{what}: {path} nests too deeply to be a config") from None
    except ValueError:  # _LongInteger, or any other number Python refuses to convert
        raise AuditInputError(f"{what}: {path} holds an integer of more than {MAX_INT_DIGITS} digits") from None
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
    if kind == "ids" and len(value) > MAX_AUX_IDS:
        raise AuditInputError(f"config.json: {where}{key} holds {len(value)} ids; a draft captures a few (limit {MAX_AUX_IDS})")
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


# ---------------------------------------------------------------- rotary keys


def _number(d: dict[str, Any], key: str, where: str) -> float | None:
    """A JSON number (int or float, never a bool), or None when absent or null."""
    if key not in d or d[key] is None:
        return None
    value = d[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise AuditInputError(f"config.json: {where}{key} must be a number, got {_clip(json.dumps(value), 60)}")
    if isinstance(value, int) and abs(value) > 10**18:
        raise AuditInputError(f"config.json: {where}{key} = {str(value)[:24]} is implausibly large")
    return float(value)


def _rope_entry(value: Any, nested: bool) -> Any:
    """An entry of a rotary dict as kept: a scalar (a string clipped), or one level down a dict
    of scalars (per-attention-type rope: full_attention/sliding_attention); lists (mrope
    sections) and deeper nesting are not needed by any check and are left out."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return value if abs(value) <= 10**18 else None
    if isinstance(value, str):
        return value[:MAX_ROPE_STRING]
    if isinstance(value, dict) and not nested:
        return {str(k)[:MAX_ROPE_STRING]: _rope_entry(v, True) for k, v in list(value.items())[:MAX_ROPE_KEYS]}
    return None


def _rope_dict(d: dict[str, Any], key: str, where: str) -> dict[str, Any] | None:
    value = _get(d, key, "dict", where)
    if value is None:
        return None
    return {str(k)[:MAX_ROPE_STRING]: _rope_entry(v, False) for k, v in list(value.items())[:MAX_ROPE_KEYS]}


def rope_keys(layer: dict[str, Any], where: str, stray: dict[str, float] | None = None) -> RopeKeys:
    """The rotary keys of the config a model is built from (``layer``, found at ``where``)."""
    return RopeKeys(
        where=where,
        model_type=_get(layer, "model_type", "str", where, "")[:MAX_ROPE_STRING],
        rope_theta=_number(layer, "rope_theta", where),
        rope_parameters=_rope_dict(layer, "rope_parameters", where),
        rope_scaling=_rope_dict(layer, "rope_scaling", where),
        partial_rotary_factor=_number(layer, "partial_rotary_factor", where),
        rope_is_neox_style=_get(layer, "rope_is_neox_style", "bool", where),
        head_dim=_get(layer, "head_dim", "int", where),
        hidden_size=_get(layer, "hidden_size", "int", where),
        num_attention_heads=_get(layer, "num_attention_heads", "int", where),
        stray=stray or {},
    )


def _draft_strays(raw: dict[str, Any], layer: dict[str, Any]) -> dict[str, float]:
    """rope_theta written where no engine builds the draft's rotary from: inside eagle_config,
    and for a speculators config anywhere outside transformer_layer_config (the layer is
    built from that nested config alone)."""
    out: dict[str, float] = {}
    eagle = raw.get("eagle_config")
    if isinstance(eagle, dict):
        value = _number(eagle, "rope_theta", "eagle_config.")
        if value is not None:
            out["eagle_config.rope_theta"] = value
    if layer is not raw:
        value = _number(raw, "rope_theta", "")
        if value is not None:
            out["rope_theta"] = value
        for key in ("rope_parameters", "rope_scaling"):
            inner = raw.get(key)
            if isinstance(inner, dict):
                value = _number(inner, "rope_theta", f"{key}.")
                if value is not None:
                    out[f"{key}.rope_theta"] = value
    return out


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
        raise AuditInputError(f"config.json: speculators_model_type is {_clip(repr(raw['speculators_model_type']), 40)}, not 'eagle3'")
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
        rope=rope_keys(layer, where, _draft_strays(raw, layer)),
        eagle_config_keys=sorted(str(k)[:MAX_ROPE_STRING] for k in eagle)[:MAX_ROPE_KEYS],
        trained_rope_theta=_number(raw, "trained_rope_theta", ""),
        trained_rope_source="config.json (trained_rope_theta)" if _number(raw, "trained_rope_theta", "") is not None else "",
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
    raw = read_json(p, "target config", path if path.is_dir() else None)
    text: dict[str, Any] = raw["text_config"] if isinstance(raw.get("text_config"), dict) else raw
    where = "text_config." if text is not raw else ""
    try:
        return TargetConfig(
            architectures=_get(raw, "architectures", "strs", "", []),
            model_type=_get(text, "model_type", "str", where, "") or _get(raw, "model_type", "str", "", ""),
            num_hidden_layers=_require(text, "num_hidden_layers", where),
            hidden_size=_require(text, "hidden_size", where),
            vocab_size=_get(text, "vocab_size", "int", where),
            path=str(p),
            rope=rope_keys(text, where),
        )
    except AuditInputError as err:
        raise AuditInputError(str(err).replace("config.json:", f"target config {p}:", 1)) from None


# ---------------------------------------------------------------- tensors


def read_safetensors_header(path: Path, folder: Path | None = None) -> dict[str, TensorInfo]:
    """Names, shapes and dtypes from a safetensors header, checked against the file size.

    The claimed header length is never quoted: until the header parses, the file's bytes
    may be anything (another file's content, through a link)."""
    real = contained(path, folder) if folder is not None else _resolve(path)
    f, size = _open_regular(real)
    with f:
        if size < 8:
            raise AuditInputError(f"{path.name}: {size} bytes, too short to be safetensors")
        (n,) = struct.unpack("<Q", f.read(8))
        if n > MAX_HEADER_BYTES:
            raise AuditInputError(f"{path.name}: header length exceeds the {MAX_HEADER_BYTES}-byte limit; not safetensors, or corrupt")
        if n > size - 8:
            raise AuditInputError(f"{path.name}: header length exceeds the file ({size} bytes); truncated or not safetensors")
        raw = f.read(n)
    try:
        header = loads_bounded(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise AuditInputError(f"{path.name}: header is not valid JSON; corrupt safetensors") from None
    except ValueError:  # _LongInteger
        raise AuditInputError(f"{path.name}: header holds an integer of more than {MAX_INT_DIGITS} digits; corrupt safetensors") from None
    if not isinstance(header, dict):
        raise AuditInputError(f"{path.name}: header is not a JSON object; corrupt safetensors")
    data_bytes = size - 8 - n
    out: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        info = _check_entry(path.name, name, entry, data_bytes)
        # Offsets count from the end of the header; the span is where the bytes lie in the file.
        info.span = (8 + n + entry["data_offsets"][0], 8 + n + entry["data_offsets"][1])
        out[name] = info
    _check_layout(path.name, header, data_bytes)
    return out


def _check_layout(file: str, header: dict[str, Any], data_bytes: int) -> None:
    """The data buffer as safetensors' own loader validates it: the tensors, ordered by
    offset, tile it exactly (each starts where the previous ended, the first at 0, the last
    ends at its end). The loader refuses anything else, so a file that passes here loads."""
    spans = sorted((entry["data_offsets"][0], entry["data_offsets"][1], name) for name, entry in header.items() if name != "__metadata__")
    end = 0
    for start, stop, name in spans:
        if start != end:
            what = "overlaps the tensor before it" if start < end else f"leaves bytes {end}..{start} unclaimed before it"
            raise AuditInputError(
                f"{file}: tensor {_clip(repr(name))} starts at byte {start}, which {what} (ends at {end}); safetensors "
                "refuses to load this file (InvalidOffset)"
            )
        end = stop
    if end != data_bytes:
        raise AuditInputError(
            f"{file}: the tensors cover {end} of the {data_bytes} data bytes; safetensors refuses to load this file "
            "(MetadataIncompleteBuffer)"
        )


def _clip(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _nbytes_within(shape: list[int], bits: int, limit: int) -> int | None:
    """``ceil(prod(shape) * bits / 8)``, or None once it passes ``limit``: the product is cut
    short, so a long shape of large dims never builds a huge integer."""
    if 0 in shape:
        return 0
    numel = 1
    for d in shape:
        numel *= d
        if numel * bits > 8 * limit:
            return None
    return (numel * bits + 7) // 8


def _check_entry(file: str, name: str, entry: Any, data_bytes: int) -> TensorInfo:
    bad = f"{file}: tensor {_clip(repr(name))}"
    if not isinstance(entry, dict):
        raise AuditInputError(f"{bad} has no header entry object; corrupt safetensors")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        shown = _clip(repr(dtype), 20) if isinstance(dtype, str) else f"of JSON type {type(dtype).__name__}"
        raise AuditInputError(f"{bad} has unknown dtype {shown}; corrupt safetensors")
    if not (isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
        raise AuditInputError(f"{bad} has an invalid shape; corrupt safetensors")
    if len(shape) > MAX_SHAPE_RANK:
        raise AuditInputError(f"{bad} has a shape of {len(shape)} dimensions (limit {MAX_SHAPE_RANK}); corrupt safetensors")
    if not (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
        and 0 <= offsets[0] <= offsets[1]
    ):
        raise AuditInputError(f"{bad} has invalid data_offsets; corrupt safetensors")
    if offsets[1] > data_bytes:
        raise AuditInputError(f"{bad} ends at byte {offsets[1]} but the file holds {data_bytes}; truncated")
    span = offsets[1] - offsets[0]
    if _nbytes_within(shape, DTYPE_BITS[dtype], span) != span:
        raise AuditInputError(f"{bad}: shape {_clip(str(shape))} {dtype} does not match its {span} bytes; corrupt")
    return TensorInfo(shape=list(shape), dtype=dtype, file=file)


# torch.save names a storage record <archive>/data/<key>; torch maps those (mmap=True).
_STORAGE_RECORD = re.compile(r"^[^/]+/data/[^/]+$")
ZIP_MAGIC = b"PK\x03\x04"  # what torch.load itself tests to choose its zip reader


def check_torch_zip(path: Path) -> None:
    """Refuse a zip ``.bin`` whose records torch would read into memory, inflating them
    first when compressed, beyond MAX_PICKLE_BYTES each. Only the zip directory is read
    (its declared sizes, the ones torch allocates for), nothing is inflated here."""
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
    except Exception:  # noqa: BLE001 - BadZipFile, NotImplementedError ("zip file version 6.4"), ...: all input errors
        raise AuditInputError(f"{path.name}: not a readable zip archive; corrupt torch checkpoint") from None
    for info in members:
        if _STORAGE_RECORD.match(info.filename):
            continue  # memory-mapped in place, never inflated
        if info.file_size > MAX_PICKLE_BYTES:
            how = "compressed " if info.compress_type != zipfile.ZIP_STORED else ""
            raise AuditInputError(
                f"{path.name}: a {how}record of {info.file_size} bytes once inflated (limit {MAX_PICKLE_BYTES}); "
                "refusing to read it into memory"
            )


def read_torch_bin(path: Path, folder: Path | None = None) -> dict[str, TensorInfo]:
    """A pickled state dict, through the weights-only unpickler (no code runs)."""
    state = _torch_state(path, folder)
    return {k: TensorInfo(shape=list(v.shape), dtype=str(v.dtype).removeprefix("torch."), file=path.name) for k, v in state.items()}


def _torch_state(path: Path, folder: Path | None = None) -> dict[str, Any]:
    """The named tensors of a pickled state dict, loaded by the weights-only unpickler with
    every size check of :func:`read_torch_bin` (a zip's storages stay memory-mapped)."""
    import pickle

    import torch

    real = contained(path, folder) if folder is not None else _resolve(path)
    f, size = _open_regular(real)
    with f:
        is_zip = f.read(len(ZIP_MAGIC)) == ZIP_MAGIC
    if is_zip:
        check_torch_zip(real)
    elif size > MAX_LEGACY_BIN_BYTES:
        raise AuditInputError(f"{path.name}: legacy (non-zip) torch file of {size} bytes; refusing to read it whole")
    try:
        # torch warns on stderr about pickle protocols; the audit's stderr is its one error line.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # mmap keeps a zip checkpoint's storages on disk: only the checked records are
            # read. A legacy file cannot be mapped and is read whole (capped above).
            obj = torch.load(real, map_location="cpu", weights_only=True, mmap=is_zip)
    except pickle.UnpicklingError as err:
        raise AuditInputError(f"{path.name}: refused by torch's weights-only loader ({_why_refused(str(err))})") from None
    except Exception as err:  # noqa: BLE001 - any failure of an untrusted file is an input error
        raise AuditInputError(f"{path.name}: not a readable torch checkpoint ({type(err).__name__})") from None
    if isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict):
        obj = obj["state_dict"]
    if not isinstance(obj, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()):
        raise AuditInputError(f"{path.name}: not a state dict of named tensors")
    return obj


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
        got = read_safetensors_header(f, root) if f.suffix == ".safetensors" else read_torch_bin(f, root)
        for name, info in got.items():
            if name in tensors:
                raise AuditInputError(f"tensor {_clip(repr(name))} appears in both {tensors[name].file} and {f.name}")
            tensors[name] = info
    return tensors, [f.name for f in files]


# ---------------------------------------------------------------- vocabulary maps


def map_tensor(tensors: dict[str, TensorInfo], which: str) -> str | None:
    """The checkpoint name of the ``d2t`` or ``t2d`` map (SGLang matches the substring; the
    trainers save it at the root)."""
    names = sorted(n for n in tensors if n.rsplit(".", 1)[-1] == which)
    return names[0] if names else None


def _map_values(root: Path, name: str, info: TensorInfo, cache: dict[str, dict[str, Any]]) -> tuple[list[int] | None, str]:
    """One map's values as integers, or None and why not."""
    if len(info.shape) != 1:
        return None, f"{name}: shape {info.shape} is not one-dimensional; values not read"
    if info.shape[0] > MAX_MAP_ENTRIES:
        return None, f"{name}: {info.shape[0]} entries, more than the {MAX_MAP_ENTRIES} read; values not read"
    if info.span is None:  # a torch pickle: the tensor is in hand once the weights-only load ran
        state = cache.get(info.file)
        if state is None:
            state = cache[info.file] = _torch_state(root / info.file, root)
        tensor = state[name]
        if tensor.dtype.is_floating_point or tensor.dtype.is_complex:
            return None, f"{name}: dtype {info.dtype} is not an integer type; values not read"
        return [int(v) for v in tensor.tolist()], ""
    code = MAP_DTYPES.get(info.dtype)
    if code is None:
        return None, f"{name}: dtype {info.dtype} is not an integer type; values not read"
    fmt, width = code
    start, end = info.span
    if end - start != width * info.shape[0]:  # _check_entry made sure of it; a second look costs nothing
        return None, f"{name}: {end - start} bytes for {info.shape[0]} entries; values not read"
    f, size = _open_regular(contained(root / info.file, root))
    with f:
        if end > size:
            raise AuditInputError(f"{info.file}: tensor {_clip(repr(name))} ends past the file; truncated")
        f.seek(start)
        blob = f.read(end - start)
    if len(blob) != end - start:
        raise AuditInputError(f"{info.file}: tensor {_clip(repr(name))} could not be read whole; truncated")
    # safetensors stores little-endian; struct's "<" reads it so on any host.
    return list(struct.unpack(f"<{info.shape[0]}{fmt}", blob)), ""


def read_vocab_maps(root: Path, tensors: dict[str, TensorInfo]) -> VocabMaps:
    """The values of ``d2t`` (int offsets) and ``t2d`` (a flag per target id), read within the
    byte range each header entry was checked to occupy (safetensors), or from the weights-only
    load (a torch pickle). A map that is absent, not 1-D, not integer or too long is not read."""
    maps = VocabMaps()
    cache: dict[str, dict[str, Any]] = {}
    for which in ("d2t", "t2d"):
        name = map_tensor(tensors, which)
        if name is None:
            continue
        values, why = _map_values(root, name, tensors[name], cache)
        if values is None:
            maps.notes.append(why)
        elif which == "d2t":
            maps.d2t = values
        else:
            maps.t2d = [bool(v) for v in values]
    return maps


def read_checkpoint(path: Path, trained_with: str | None = None) -> DraftCheckpoint:
    """Config, tensor inventory and vocabulary maps of a draft checkpoint directory.

    ``trained_with``: the user's word on the trainer (``--trained-with``); otherwise
    ``SPECTRACE_TRAINED_WITH``, then the folder's own record (audit.trainer_record).
    """
    from ..rules.readings import TRAINED_WITH_ENV
    from .trainer_record import read_trainer_record

    if not path.exists():
        raise AuditInputError(f"{path}: no such directory")
    if not path.is_dir():
        raise AuditInputError(f"{path}: not a directory (pass the draft checkpoint directory)")
    raw = read_json(path / "config.json", "draft config", path)
    config = parse_draft_config(raw)
    record = read_trainer_record(path, raw, trained_with or os.environ.get(TRAINED_WITH_ENV))
    bad = [check.file for check in record.sha256 if not check.ok]
    stated_base = config.trained_rope_theta
    config = config.model_copy(
        update={
            "trained_with": record.trainer,
            "trained_with_source": record.source,
            "checksum_mismatches": bad,
            "trained_rope_theta": stated_base if stated_base is not None else record.rope_theta,
            "trained_rope_source": config.trained_rope_source if stated_base is not None else record.rope_source,
        }
    )
    tensors, files = read_tensors(path)
    maps = read_vocab_maps(path, tensors)
    return DraftCheckpoint(path=str(path), config=config, tensors=tensors, files=files, maps=maps)
