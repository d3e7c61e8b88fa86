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


MAX_CAUSES, MAX_TEXT = 10, 400  # what a result written by spectrace replay holds at most


def _text(value: Any, limit: int = MAX_TEXT) -> str:
    return value[:limit] if isinstance(value, str) else ""


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def result_finding(raw: Any) -> Finding | None:
    """The ``replay_divergence`` finding of one replay result (``<stem>.replay.json``, as
    ``spectrace replay`` writes it, parsed); None for a result that agrees or is not one.
    Any field of another type than the writer's is taken as absent, and texts are cut: the
    file is one anyone may have put beside a trace."""
    if not isinstance(raw, Mapping) or raw.get("agree", True) is not False or not isinstance(raw.get("first_divergence"), str):
        return None
    module = _text(raw["first_divergence"], 40)
    modules = raw.get("modules")
    modules = modules if isinstance(modules, list) else []
    check = next((m for m in modules if isinstance(m, Mapping) and m.get("module") == module), {})
    causes = raw.get("causes")
    causes = [_text(c) for c in causes[:MAX_CAUSES] if isinstance(c, str)] if isinstance(causes, list) else []
    return replay_divergence(
        module, _text(raw.get("served")), _text(raw.get("expected")), causes,
        _number(check.get("max_error")), _number(check.get("tolerance")), _text(raw.get("replay_file"), 255),
    )  # fmt: skip


def read_result(path: str) -> Finding | None:
    """:func:`result_finding` of the replay result at ``path``; None when it cannot be read
    (too large, not JSON, nested past the parser's stack, not a regular file)."""
    import json

    from ..safe_files import SafeFileError, read_regular

    try:
        raw = json.loads(read_regular(path, MAX_RESULT_BYTES).decode("utf-8"))
    except (SafeFileError, OSError, ValueError, RecursionError):  # RecursionError: a "[[[[..." bomb
        return None
    return result_finding(raw)


def findings_beside(folder: str) -> list[Finding]:
    """The ``replay_divergence`` findings of the replay results in a trace folder (none for a
    result that agrees, or one that cannot be read)."""
    import os

    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(RESULT_SUFFIX))
    except OSError:
        return []
    found = (read_result(os.path.join(folder, name)) for name in names)
    return [f for f in found if f is not None]
