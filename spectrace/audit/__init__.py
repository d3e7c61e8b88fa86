"""Offline pre-launch audit of an EAGLE-3 draft checkpoint against a serving engine.

    >>> from spectrace.audit.command import main
    >>> main(["tests/fixtures/speculators_tiny", "--target-config", "tests/fixtures/target_llama_config.json"])

``checkpoint`` reads untrusted files safely, ``engines`` models what each engine's draft
class expects, ``checks`` turns the two into findings, ``command`` is the CLI.
"""

from __future__ import annotations

from .checkpoint import AuditInputError, DraftCheckpoint, read_checkpoint, read_target_config
from .checks import AuditResult, audit
from .engines import get_engine

__all__ = [
    "AuditInputError",
    "AuditResult",
    "DraftCheckpoint",
    "audit",
    "get_engine",
    "read_checkpoint",
    "read_target_config",
]
