"""``spectrace doctor``: the engine's own code builds and runs the user's pair, shrunk, on the CPU.

``spectrace audit`` predicts from rule tables what an engine will do with a draft; a table
can be wrong. The doctor asks the engine: SGLang's (or vLLM's) config loading, class
selection, loaders, capture set-up and forward run on the user's own configs at tiny widths (every
structural key kept, :mod:`.shrink`), the draft's weights named exactly as the user's
checkpoint names them, with spectrace's integration of that engine tracing as under
``SPECTRACE=1``. The records and findings are those a live server would give.

    >>> from spectrace.doctor import diagnose                      # doctest: +SKIP
    >>> report = diagnose(Path("my-draft"), Path("target/config.json"))
    >>> [f["code"] for f in report.findings if f["severity"] == "error"]

Imports torch and the engine only inside :func:`diagnose`.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from .report import LIMITS, DoctorReport

__all__ = ["ENGINES", "LIMITS", "DoctorInputError", "DoctorReport", "EngineMissing", "diagnose", "engine_installed"]

# The engines the doctor runs, and the script that installs each one's CPU build.
ENGINES = {"sglang": "scripts/install-sglang-cpu.sh", "vllm": "scripts/install-vllm-cpu.sh"}


class DoctorInputError(Exception):
    """Unusable input: one line, exit 2."""


class EngineMissing(Exception):
    """The engine is not installed here: one line saying how to get its CPU build, exit 2."""


def engine_installed(engine: str) -> bool:
    return importlib.util.find_spec(engine) is not None


def _target_config(path: Path) -> dict[str, Any]:
    from ..audit.checkpoint import read_json

    if path.is_dir():
        return read_json(path / "config.json", "target config", path)
    return read_json(path, "target config")


def diagnose(draft_dir: Path, target: Path, engine: str = "sglang") -> DoctorReport:
    """Build and run the pair on ``engine``'s CPU build; the records, facts and findings."""
    from ..audit.checkpoint import AuditInputError, read_json, read_tensors, read_vocab_maps

    if engine not in ENGINES:
        raise DoctorInputError(f"argument --engine: {engine!r} is not one of {', '.join(ENGINES)}")
    try:
        if not draft_dir.is_dir():
            raise DoctorInputError(f"{draft_dir}: no such directory (pass the draft checkpoint directory)")
        if not target.exists():
            raise DoctorInputError(f"{target}: no such file or directory (pass the target's directory or its config.json)")
        draft_config = read_json(draft_dir / "config.json", "draft config", draft_dir)
        target_config = _target_config(target)
        tensors, _ = read_tensors(draft_dir)
        maps = read_vocab_maps(draft_dir, tensors)
    except AuditInputError as err:
        raise DoctorInputError(str(err)) from None
    if not engine_installed(engine):
        raise EngineMissing(
            f"{engine} is not installed here; the doctor runs its classes on the CPU: install its CPU build with {ENGINES[engine]} VENV"
        )
    from ..recorder import Recorder
    from ..settings import Settings
    from .engine_common import EngineRunError

    if engine == "vllm":
        from . import vllm_run as engine_run
    else:
        from . import sglang_run as engine_run  # type: ignore[no-redef]

    # Statistics off: the weights are random, so what the value checks (chunk provenance,
    # feature skew) would compare says nothing of the user's pair.
    recorder = Recorder(Settings.from_env({"SPECTRACE_QUIET": "1", "SPECTRACE_STATS": "off"}), directory=None)
    failure: str | None = None
    engine_log: list[str] = []
    facts = None
    try:
        facts = engine_run.run(target_config, draft_config, tensors, maps, recorder)
    except EngineRunError as err:
        failure, engine_log = str(err), err.engine_log
    repacked = set(facts.cpu_repacked) if facts is not None else set()
    records = [r for r in recorder.records() if not _cpu_repack_only(r, repacked)]
    return DoctorReport.build(
        draft=str(draft_dir), target=str(target), engine=engine, facts=facts, records=records, failure=failure, engine_log=engine_log
    )


def _cpu_repack_only(record: Any, repacked: set[str]) -> bool:
    """A replaced-weights finding about parameters the CPU build itself repacked (not a server's step)."""
    if getattr(record, "type", None) != "finding" or record.code != "weights_replaced_after_load" or not repacked:
        return False
    parameters = record.evidence.get("parameters") or []
    return bool(parameters) and set(parameters) <= repacked
