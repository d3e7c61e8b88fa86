"""The JSON text of ``call`` records, from the engine's notes (on the record worker).

The hooks note each call as plain tuples (:data:`RawCall`, :data:`RawTensor`); this module
turns them into the records' JSON. :func:`call_fields` gives a call's fields (for the
schema, observers and object sinks) and :func:`dumps` writes fields as JSON.
:func:`call_texts` writes a whole step's calls straight from the notes, piece by piece:
most of a call's text is the same from step to step (the module's names, the descriptions
of tensors without statistics), so it is cached in pieces that pydantic-core wrote, and
joined in the field order of :func:`call_fields`. The text is the one
``dumps(call_fields(...))`` gives (tests/hooks/test_call_text.py compares the two), at a third of
its cost.

    >>> texts = call_texts(step_calls, values)      # values: {generation: [row, ...]}
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ..records import Call
from .tensor_stats import stats_for

# One tensor as a hook notes it: (arg, shape, dtype, device, statistics generation,
# statistics index or -1, numel).
RawTensor = tuple[str, tuple[int, ...], str, str, int, int, int]
# The engine's view of a step, when an integration supplies one (Tracer.context_of):
# (forward mode, real token rows, draft-step index).
StepContext = tuple[str | None, int | None, int | None]
# One call: (step, seq, module, module_type, root, inputs, outputs, t_unix, graph_capture,
# role, context).
RawCall = tuple[int, int, str, str, str, list[RawTensor], list[RawTensor], float, bool, str | None, StepContext | None]
# The statistics rows of each generation (readback): {generation: [row or None, ...]}.
Values = dict[int, list[list[float] | None]]


def dumps_json(fields: dict[str, Any]) -> str:
    # The standard library's encoder: 9 us for a decoder-layer call, against 2.4 us for
    # pydantic-core's. A non-finite float (statistics never hold one) goes through the
    # schema, which writes it as null.
    try:
        return json.dumps(fields, separators=(",", ":"), allow_nan=False)
    except ValueError:
        return Call.model_validate(fields).model_dump_json()


def dumps_core(fields: dict[str, Any]) -> str:
    return to_json(fields, inf_nan_mode="null").decode()


try:
    from pydantic_core import to_json

    to_json({"x": float("nan")}, inf_nan_mode="null")
    dumps = dumps_core
except Exception:  # an older pydantic-core without inf_nan_mode
    dumps = dumps_json


def call_fields(raw: RawCall, values: Values) -> dict[str, Any]:
    """The fields of one :class:`Call` record from a hook's note."""
    step, seq, module, module_type, root, inputs, outputs, t_unix, capture, role, ctx = raw
    fields = {
        "type": "call",
        "step": step,
        "seq": seq,
        "module": module,
        "module_type": module_type,
        "root": root,
        "inputs": [_meta_fields(t, values) for t in inputs],
        "outputs": [_meta_fields(t, values) for t in outputs],
        "t_unix": t_unix,
        "graph_capture": capture,
        "role": role,
    }
    fields["forward_mode"], fields["tokens"], fields["draft_step"] = ctx if ctx is not None else (None, None, None)
    fields["graph_replay"], fields["graph"] = False, None
    return fields


def _meta_fields(raw: RawTensor, values: Values) -> dict[str, Any]:
    arg, shape, dtype, device, generation, index, numel = raw
    rows = values.get(generation) if index >= 0 else None
    row = rows[index] if rows is not None and index < len(rows) else None
    try:
        dims = [int(s) for s in shape]
    except Exception:  # a symbolic (jagged) size has no single value
        dims = []
    return {"arg": arg, "shape": dims, "dtype": dtype, "device": device, "stats": stats_for(row, numel, dtype) if row is not None else None}


# ------------------------------------------------------------ JSON, piece by piece
_PIECES_MAX = 4096  # cached pieces per table: the tables are cleared when full (bounded memory)
# (module, module_type, root, graph_capture, role, context) -> the call's text from
# "module" to the opening of "inputs", and from "graph_capture" to the end
_frames: dict[tuple[Any, ...], tuple[str, str]] = {}
_meta_pieces: dict[tuple[Any, ...], str] = {}  # a tensor description up to its statistics
_stats_texts: dict[tuple[int, int], str] = {}  # (generation, index) -> the statistics' text
_NO_STATS = "null}"


def _piece(value: Any) -> str:
    return to_json(value, inf_nan_mode="null").decode()


def call_texts(calls: list[RawCall], values: Values, pause: Callable[[], None] | None = None) -> list[str]:
    """The JSON text of each of one step's calls (as :func:`dumps` of :func:`call_fields`).

    Every note of ``calls`` is held during the pass, so a note shared by calls (the keyword
    arguments of a stack's layers) is written once, found by its identity. ``pause``:
    called every four records (the record worker steps aside for a host that is awake)."""
    texts: list[str] = []
    written: dict[int, str] = {}
    frames_get = _frames.get
    for n, raw in enumerate(calls, 1):
        step, seq, module, module_type, root, inputs, outputs, t_unix, capture, role, ctx = raw
        key = (module, module_type, root, capture, role, ctx)
        frame = frames_get(key) or _frame(key)
        texts.append(
            "".join(
                (
                    '{"type":"call","step":',
                    str(step) if type(step) is int else _piece(step),  # an int's JSON is its str()
                    ',"seq":',
                    str(seq) if type(seq) is int else _piece(seq),
                    frame[0],
                    _metas(inputs, values, written),
                    '],"outputs":[',
                    _metas(outputs, values, None),
                    '],"t_unix":',
                    _piece(t_unix),  # (pydantic-core writes a float in 40 % of repr()'s time)
                    frame[1],
                )
            )
        )
        if pause is not None and n % 4 == 0:
            pause()
    return texts


def call_text(raw: RawCall, values: Values) -> str:
    """One call's text, as :func:`call_texts` writes it."""
    return call_texts([raw], values)[0]


def _frame(key: tuple[Any, ...]) -> tuple[str, str]:
    module, module_type, root, capture, role, ctx = key
    mode, tokens, draft = ctx if ctx is not None else (None, None, None)
    head = f',"module":{_piece(module)},"module_type":{_piece(module_type)},"root":{_piece(root)},"inputs":['
    tail = "".join(
        (
            ',"graph_capture":',
            "true" if capture is True else "false" if capture is False else _piece(capture),
            ',"role":',
            _piece(role),
            ',"forward_mode":',
            _piece(mode),
            ',"tokens":',
            _piece(tokens),
            ',"draft_step":',
            _piece(draft),
            ',"graph_replay":false,"graph":null}',
        )
    )
    if len(_frames) >= _PIECES_MAX:
        _frames.clear()
    _frames[key] = frame = (head, tail)
    return frame


def _metas(raws: list[RawTensor], values: Values, written: dict[int, str] | None) -> str:
    """The tensors' texts, comma-joined; ``written``: texts by the note's identity."""
    parts: list[str] = []
    heads_get = _meta_pieces.get
    for raw in raws:
        if written is not None:
            text = written.get(id(raw))
            if text is not None:
                parts.append(text)
                continue
        head = None
        if raw[5] < 0:  # no statistics: the cached description and null (the common case, inline)
            try:
                head = heads_get(raw[:4])
            except TypeError:  # a symbolic size does not hash
                pass
        text = head + _NO_STATS if head is not None else _meta_text(raw, values)
        if written is not None:
            written[id(raw)] = text
        parts.append(text)
    return ",".join(parts)


def _meta_text(raw: RawTensor, values: Values) -> str:
    # The description up to its statistics is the same every time this tensor kind is seen.
    key = raw[:4]
    try:
        head = _meta_pieces.get(key)
    except TypeError:  # a symbolic size does not hash
        return _piece(_meta_fields(raw, values))
    if head is None:
        text = _piece(_meta_fields((*key, 0, -1, 0), values))
        if not text.endswith(_NO_STATS):
            return _piece(_meta_fields(raw, values))
        head = text[: -len(_NO_STATS)]
        if len(_meta_pieces) >= _PIECES_MAX:
            _meta_pieces.clear()
        _meta_pieces[key] = head
    index = raw[5]
    if index >= 0:
        rows = values.get(raw[4])
        row = rows[index] if rows is not None and index < len(rows) else None
        if row is not None:
            # A tensor seen twice in a step (layer i's output, layer i+1's input) has one row:
            # its text is written once. Generations are never reused, so keys never go stale.
            key = (raw[4], index)
            text = _stats_texts.get(key)
            if text is None:
                if len(_stats_texts) >= _PIECES_MAX:
                    _stats_texts.clear()
                text = _stats_texts[key] = _piece(stats_for(row, raw[6], raw[2]))
            return f"{head}{text}}}"
    return head + _NO_STATS
