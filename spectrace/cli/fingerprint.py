"""``spectrace fingerprint --out FILE``: the healthy reference pipeline's fused-input fingerprint."""

from __future__ import annotations

import argparse

from .errors import OK, parser, run


def build_parser() -> argparse.ArgumentParser:
    p = parser(
        "spectrace fingerprint",
        "Record per-chunk statistics of the fused draft input cat(hs[b0], hs[b1], hs[b2]) "
        "from the healthy reference pipeline. In your own data generation, use "
        "spectrace.eagle3.fingerprint.FingerprintCollector on the fused states and save_fingerprint().",
        "example: spectrace fingerprint --out reference.json, then SPECTRACE_FINGERPRINT=reference.json "
        "compares a traced run's fused input with it",
        raw=False,
    )
    p.add_argument("--out", required=True, help="where to write the fingerprint JSON")
    return p


def main(argv: list[str]) -> int:
    """Entry point of ``spectrace fingerprint``: record the reference pipeline's fused-input fingerprint."""
    return run("spectrace fingerprint", _fingerprint, argv)


def _fingerprint(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from ..demo import reference_fingerprint
    from ..eagle3.fingerprint import save_fingerprint

    fp = reference_fingerprint()
    save_fingerprint(fp, args.out)
    print(f"wrote {args.out}: {len(fp.chunks)} chunks of {fp.chunk_width}, boundaries {fp.boundaries}")
    return OK
