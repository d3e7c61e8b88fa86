"""The finding of a ``spectrace replay`` that diverged (the facts come from :mod:`spectrace.replay`)."""

from __future__ import annotations

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


def findings_beside(folder: str) -> list[Finding]:
    """The ``replay_divergence`` findings of the replay results in a trace folder (none for a
    result that agrees, or one that cannot be read)."""
    import json
    import os

    from ..safe_files import SafeFileError, open_regular

    out: list[Finding] = []
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(RESULT_SUFFIX))
    except OSError:
        return out
    for name in names:
        try:
            fd, size = open_regular(os.path.join(folder, name))
        except SafeFileError:
            continue
        try:
            if size > MAX_RESULT_BYTES:
                continue
            raw = json.loads(os.read(fd, size + 1).decode("utf-8"))
        except (OSError, ValueError):
            continue
        finally:
            os.close(fd)
        if not isinstance(raw, dict) or raw.get("agree", True) or not isinstance(raw.get("first_divergence"), str):
            continue
        check = next((m for m in raw.get("modules") or [] if isinstance(m, dict) and m.get("module") == raw["first_divergence"]), {})
        causes = [str(c) for c in raw.get("causes") or []]
        out.append(
            replay_divergence(
                raw["first_divergence"], str(raw.get("served", "")), str(raw.get("expected", "")), causes,
                check.get("max_error"), check.get("tolerance"), str(raw.get("replay_file", "")),
            )
        )  # fmt: skip
    return out
