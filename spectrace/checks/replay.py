"""The finding of a ``spectrace replay`` that diverged (the facts come from :mod:`spectrace.replay`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..records import Finding
from ..rules.catalogue import finding


def replay_divergence(
    module: str,
    served: str,
    reference: str,
    causes: list[str],
    max_error: float | None,
    tolerance: float | None,
    replay_file: str,
) -> Finding:
    """``replay_divergence`` for the first module whose served output differs from the checkpoint's."""
    return finding(
        "replay_divergence",
        f"the served draft's {module} computes something else than its checkpoint on the same inputs "
        f"(served {served}, checkpoint {reference}); causes that fit: {'; '.join(causes)}",
        module=module,
        evidence={
            "replay_served": served,
            "replay_reference": reference,
            "replay_causes": causes,
            "replay_max_error": max_error,
            "replay_tolerance": tolerance,
            "replay_file": replay_file,
        },
        source="spectrace replay",
    )


RESULT_SUFFIX = ".replay.json"  # what spectrace replay writes beside the trace (spectrace.replay.file)
MAX_RESULT_BYTES = 1 << 20


def result_finding(raw: Any) -> Finding | None:
    """The ``replay_divergence`` finding of one replay result (``<stem>.replay.json``, as
    ``spectrace replay`` writes it, parsed); None for a result that agrees or is not one."""
    if not isinstance(raw, Mapping) or raw.get("agree", True) or not isinstance(raw.get("first_divergence"), str):
        return None
    check = next((m for m in raw.get("modules") or [] if isinstance(m, Mapping) and m.get("module") == raw["first_divergence"]), {})
    causes = [str(c) for c in raw.get("causes") or []]
    return replay_divergence(
        raw["first_divergence"], str(raw.get("served", "")), str(raw.get("expected", "")), causes,
        check.get("max_error"), check.get("tolerance"), str(raw.get("replay_file", "")),
    )  # fmt: skip


def findings_beside(folder: str) -> list[Finding]:
    """The ``replay_divergence`` findings of the replay results in a trace folder (none for a
    result that agrees, or one that cannot be read)."""
    import json
    import os

    from ..safe_files import SafeFileError, read_regular

    out: list[Finding] = []
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(RESULT_SUFFIX))
    except OSError:
        return out
    for name in names:
        try:
            found = result_finding(json.loads(read_regular(os.path.join(folder, name), MAX_RESULT_BYTES).decode("utf-8")))
        except (SafeFileError, OSError, ValueError):
            continue
        if found is not None:
            out.append(found)
    return out
