"""Call records from one read-back of a captured graph's statistics table.

A table has one slot per tensor a hook recorded while the graph was captured (a module's
input, its output, a chunk of the fused draft input). The slots of one module call (same
module, same draft step) become one ``call`` record, like an eager step's, with
``graph_replay`` set, the replay's forward mode, and shapes of the *real* rows: the
kernels read only ``real_bs * rows_per_seq`` rows, so padded rows (stale data from
earlier replays) are in no statistic.
"""

from __future__ import annotations

import math
from typing import Any


def real_rows(slot: Any, real_bs: int) -> int:
    padded = int(slot.padded_shape[0]) if slot.padded_shape else 0
    return max(0, min(padded, int(real_bs) * int(slot.rows_per_seq)))


def _shape(slot: Any, rows: int) -> list[int]:
    shape = [int(d) for d in slot.padded_shape]
    if not shape:
        return []
    shape[0] = rows
    inner = math.prod(shape[1:-1]) if len(shape) > 2 else 1
    if len(shape) >= 2 and inner and slot.row_elems // inner != shape[-1]:
        shape[-1] = slot.row_elems // inner  # a column range (one chunk of the fused input)
    return shape


def readout_fields(readout: Any, slots: Any, first_seq: int) -> list[dict[str, Any]]:
    """The JSON-ready fields of the call records of one read-back (worker thread)."""
    table = readout.table
    context = readout.context
    groups: dict[tuple[str, Any], dict[str, Any]] = {}
    seq = first_seq
    device = str(table.rows.device)
    for slot in table.slots:
        key = (slot.name, slot.draft_step)
        fields = groups.get(key)
        rows = real_rows(slot, readout.real_bs)
        if fields is None:
            fields = groups[key] = {
                "type": "call",
                "step": int(context.get("step", -1)),
                "seq": seq,
                "module": slot.name,
                "module_type": slot.module_type,
                "root": slot.name.split(".", 1)[0],
                "inputs": [],
                "outputs": [],
                "t_unix": float(context.get("t_unix", 0.0)),
                "graph_capture": False,
                "role": slot.role,
                "forward_mode": context.get("mode"),
                "tokens": rows,
                "draft_step": slot.draft_step,
                "graph_replay": True,
                "graph": table.label,
            }
            seq += 1
        stats = slots.stats_of(readout, slot) if rows else None
        meta = {"arg": slot.arg, "shape": _shape(slot, rows), "dtype": slot.dtype, "device": device, "stats": stats}
        (fields["inputs"] if slot.arg.startswith("input") else fields["outputs"]).append(meta)
    return list(groups.values())
