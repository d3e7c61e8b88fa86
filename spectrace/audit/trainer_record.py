"""What a checkpoint folder says about its own training: which trainer wrote it.

An SGLang-format config's ids can mean two things (SpecForge: boundary = id + 1; a hand
conversion from speculators: boundary = id). The folder often settles it: speculators
writes its own config (``speculators_model_type``, ``speculators_version``) and, in its
published checkpoints, provenance files beside it (``run.yaml``, ``train_command.txt``,
``vllm_command.txt``, ``checkpoint_sha256.txt``); SpecForge's command line names its
scripts. The user's own word (``--trained-with`` / ``SPECTRACE_TRAINED_WITH``) comes first.

Files are untrusted: each is read bounded, as text, and only searched for names.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from pydantic import BaseModel, Field

from ..rules.conventions import TRAINER_CONVENTIONS

PROVENANCE_FILES = ("run.yaml", "train_command.txt", "vllm_command.txt", "checkpoint_sha256.txt")
_MAX_TEXT = 256 * 1024  # a provenance file larger than this is not a provenance file
_SHA_LINE = re.compile(r"^([0-9a-fA-F]{64})\s+\*?(\S.*)$")
# The base a run file or command line says the draft was trained with: ``rope_theta: 500000``
# (a run.yaml), ``--rope-theta 500000`` / ``--rope_theta=500000`` (a command line).
_ROPE_THETA = re.compile(r"(?:^|[\s{,\"'-])rope[_-]theta[\"']?\s*[:= ]\s*([0-9][0-9_.eE+]{0,24})", re.MULTILINE)


class ShaCheck(BaseModel):
    """One line of checkpoint_sha256.txt against the file it names."""

    file: str
    expected: str
    actual: str | None = Field(None, description="the file's sha256; None: the file is missing or not a plain file")

    @property
    def ok(self) -> bool:
        return self.actual == self.expected.lower()


class TrainerRecord(BaseModel):
    """Which trainer wrote the draft, how spectrace knows, and the folder's checksums."""

    trainer: str | None = Field(None, description="specforge or speculators; None: the folder does not say")
    source: str = Field("", description="what said so: --trained-with, a file name, config.json keys")
    files: list[str] = Field(default=[], description="the provenance files present")
    sha256: list[ShaCheck] = []
    rope_theta: float | None = Field(None, description="the base the record says the draft was trained with")
    rope_source: str = Field("", description="the file that says so")


def _text(path: Path) -> str | None:
    try:
        if not path.is_file() or path.stat().st_size > _MAX_TEXT:
            return None
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def _named_trainer(text: str) -> str | None:
    """The trainer a command line or run file names, when it names exactly one."""
    low = text.lower()
    found = {t for t in TRAINER_CONVENTIONS if t in low}
    return found.pop() if len(found) == 1 else None


def _stated_base(text: str) -> float | None:
    """The one rotary base a record names (None: none, or several that disagree)."""
    found: set[float] = set()
    for match in _ROPE_THETA.finditer(text):
        try:
            found.add(float(match.group(1).replace("_", "")))
        except ValueError:
            continue
    return found.pop() if len(found) == 1 else None


def _sha_checks(folder: Path, text: str) -> list[ShaCheck]:
    checks: list[ShaCheck] = []
    root = folder.resolve()
    for line in text.splitlines()[:1000]:
        match = _SHA_LINE.match(line.strip())
        if not match:
            continue
        expected, name = match.group(1), match.group(2).strip()
        target = (folder / name).resolve()
        actual = None
        if target.is_relative_to(root) and target.is_file():  # never follow a name out of the folder
            digest = hashlib.sha256()
            with target.open("rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(block)
            actual = digest.hexdigest()
        checks.append(ShaCheck(file=name, expected=expected, actual=actual))
    return checks


def read_trainer_record(folder: Path, raw_config: dict, trained_with: str | None = None) -> TrainerRecord:
    """The trainer of the checkpoint in ``folder`` (``raw_config``: its config.json as read)."""
    present = [name for name in PROVENANCE_FILES if (folder / name).is_file()]
    sha = _sha_checks(folder, _text(folder / "checkpoint_sha256.txt") or "") if "checkpoint_sha256.txt" in present else []
    record = TrainerRecord(files=present, sha256=sha)
    for name in ("run.yaml", "train_command.txt"):
        text = _text(folder / name) if name in present else None
        base = _stated_base(text) if text else None
        if base is not None:
            record = record.model_copy(update={"rope_theta": base, "rope_source": name})
            break
    if trained_with:
        value = trained_with.strip().lower()
        if value in TRAINER_CONVENTIONS:
            return record.model_copy(update={"trainer": value, "source": "--trained-with"})
    if "speculators_model_type" in raw_config or "speculators_version" in raw_config:
        return record.model_copy(update={"trainer": "speculators", "source": "config.json (speculators_model_type)"})
    for name in ("train_command.txt", "run.yaml"):
        text = _text(folder / name) if name in present else None
        trainer = _named_trainer(text) if text else None
        if trainer:
            return record.model_copy(update={"trainer": trainer, "source": name})
    return record
