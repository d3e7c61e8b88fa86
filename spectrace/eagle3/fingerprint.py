"""Per-chunk statistics of the fused draft input ``cat(hs[b0], hs[b1], hs[b2])``.

Widths cannot tell an embedding chunk from a deep-layer chunk (bug 3); their scale
can. A :class:`FingerprintCollector` accumulates each chunk's sums on the tensor's
device (no sync per call) and produces a :class:`~spectrace.records.Fingerprint`.
Record one while generating training data (or from a healthy reference run), save it,
and compare the serving run's fingerprint with it (``feature_skew``).

    >>> collector = FingerprintCollector(num_chunks=3)
    >>> collector.observe(fused)            # (tokens, 3 * hidden)
    >>> save_fingerprint(collector.result("draft.input", [1, 3, 5]), "fp.json")
"""

from __future__ import annotations

import math

import torch

from ..checks.live import read_fingerprint
from ..records import Fingerprint, TensorStats
from ..safe_files import SafeFileError, write_private


class FingerprintCollector:
    """Running per-chunk sums (count, sum, sumsq, absmax) kept on the tensor's device."""

    def __init__(self, num_chunks: int) -> None:
        self.num_chunks = num_chunks
        self.chunk_width: int | None = None
        self._sums: torch.Tensor | None = None  # (num_chunks, 3): sum, sumsq, absmax
        self._count = 0

    def observe(self, fused: torch.Tensor) -> None:
        """Add one fused input (``[..., num_chunks * width]``); a width that does not split is ignored."""
        width = fused.shape[-1]
        if width % self.num_chunks:
            return
        chunk = width // self.num_chunks
        if self.chunk_width not in (None, chunk):
            return
        self.chunk_width = chunk
        with torch.no_grad():
            x = fused.detach().reshape(-1, self.num_chunks, chunk)
            row = torch.stack(
                [
                    x.sum(dim=(0, 2), dtype=torch.float64),
                    # vector_norm accumulates in float64 without a float64 copy of x.
                    torch.linalg.vector_norm(x, 2, dim=(0, 2), dtype=torch.float64).square(),
                    torch.linalg.vector_norm(x, math.inf, dim=(0, 2), dtype=torch.float64),
                ],
                dim=1,
            )
            if self._sums is None:
                self._sums = row
            else:
                self._sums = torch.stack(
                    [self._sums[:, 0] + row[:, 0], self._sums[:, 1] + row[:, 1], torch.maximum(self._sums[:, 2], row[:, 2])], dim=1
                )
            self._count += x.shape[0] * chunk

    def result(self, module: str, boundaries: list[int] | None = None) -> Fingerprint | None:
        if self._sums is None or not self._count:
            return None
        chunks = []
        for total, sumsq, absmax in self._sums.cpu().tolist():
            mean = total / self._count
            std = math.sqrt(max(sumsq / self._count - mean * mean, 0.0))
            chunks.append(TensorStats(mean=mean, std=std, absmax=absmax, numel=self._count))
        return Fingerprint(module=module, chunk_width=int(self.chunk_width or 0), chunks=chunks, boundaries=boundaries)


def save_fingerprint(fingerprint: Fingerprint, path: str) -> None:
    """Write ``fingerprint`` as JSON at ``path``: a 0600 file put in place by a rename (a
    symlink planted at the name is replaced, its target never written), missing folders
    0700. Raises :class:`FingerprintError` with a one-line reason."""
    try:
        write_private(path, (fingerprint.model_dump_json(indent=2) + "\n").encode("utf-8"))
    except SafeFileError as exc:
        raise FingerprintError(str(exc)) from None


class FingerprintError(ValueError):
    """A fingerprint file that cannot be used (one-line message)."""


def load_fingerprint(path: str) -> Fingerprint:
    """A fingerprint file (a regular file, never a FIFO, device or symlink), or
    :class:`FingerprintError` with a one-line reason."""
    try:
        return read_fingerprint(path)
    except ValueError as exc:
        raise FingerprintError(str(exc)) from None
