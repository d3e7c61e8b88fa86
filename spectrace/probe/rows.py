"""Which kept rows the probe judges, and the target's choice at each.

A draft forward from position 0 reads the target's ids shifted by one: its row ``t`` holds
the token at position ``t + 1`` and the target's state at ``t``, and proposes the token
for position ``t + 2``, which the target chose at its own row ``t + 1``. The replay file
keeps, beside each draft forward, the target forward just before it (``target_in``, its
ids; ``target_next``, its top-1 at each row); the two belong together when the draft's
ids are the target's shifted by one.

A row is *target-written* when the token it reads is the one the target itself chose at
the row before (``x[t+1] == target_next[t]``): the text the draft was trained on and
serves at decode. Prompt rows are judged lower (a prompt's next token is often not the
target's choice, and the draft was trained on the target's), so target-written rows are
used when there are :data:`MIN_WRITTEN` of them, else every paired row, and the result
says which.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..replay.file import ReplayData

MIN_WRITTEN = 16


@dataclass
class ProbeRows:
    """The judged rows of every paired forward: per forward, its tensors, the rows and the target's choice."""

    forwards: list[tuple[ReplayData, torch.Tensor, torch.Tensor]] = field(default_factory=list)  # (forward, rows, label)
    paired_rows: int = 0
    written_rows: int = 0
    unpaired: int = 0  # forwards whose kept target rows are not this forward's target
    without_target: int = 0  # forwards kept without the target's choices
    which: str = ""  # "target-written" or "all paired rows (prompt rows)"

    @property
    def rows(self) -> int:
        return sum(int(r.numel()) for _, r, _ in self.forwards)


def select_rows(forwards: list[ReplayData]) -> ProbeRows:
    """Pair each forward with its target's choices and pick the rows to judge."""
    out = ProbeRows()
    paired: list[tuple[ReplayData, torch.Tensor, torch.Tensor, torch.Tensor]] = []  # forward, rows, label, written
    for fwd in forwards:
        t = fwd.tensors
        ids, tin, tnext = t.get("input_ids"), t.get("target_in"), t.get("target_next")
        if ids is None or tin is None or tnext is None:
            out.without_target += 1
            continue
        n = min(int(ids.numel()), int(tin.numel()) - 1, int(tnext.numel()) - 1)
        if n <= 0 or not torch.equal(ids[:n].long(), tin[1 : n + 1].long()):
            out.unpaired += 1
            continue
        rows = torch.arange(n)
        label = tnext[1 : n + 1].long()
        written = ids[:n].long() == tnext[:n].long()
        paired.append((fwd, rows, label, written))
        out.paired_rows += n
        out.written_rows += int(written.sum())
    use_written = out.written_rows >= MIN_WRITTEN
    out.which = "target-written rows" if use_written else "all paired rows (mostly prompt rows: agreement reads lower there)"
    for fwd, rows, label, written in paired:
        keep = written if use_written else torch.ones_like(written)
        if bool(keep.any()):
            out.forwards.append((fwd, rows[keep], label[keep]))
    return out
