"""The demo's scenarios, each run once per test run and shared on disk by every test (and xdist worker).

A scenario traced through the reference pipeline takes tens of seconds on a small machine, and
many test modules read the same ones. Each result is kept in a folder named by a hash of
everything that decides it: the package's source and shipped data, the library versions, the
``SPECTRACE*`` environment, the scenario and its arguments. The first test that asks builds it
under a file lock (a second worker waits for it, then reads it); the folder appears whole, by
rename. A test gets its own copy of the trace, so one that edits its files changes no other.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import os
import pickle
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def source_digest() -> str:
    """A hash of the imported package's files (source and shipped data) and what runs them."""
    import torch
    import transformers

    import spectrace

    package = Path(spectrace.__file__).resolve().parent
    h = hashlib.sha256()
    for path in sorted(p for p in package.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        h.update(str(path.relative_to(package)).encode() + b"\0")
        h.update(path.read_bytes())
    h.update(f"{sys.version}|{torch.__version__}|{transformers.__version__}".encode())
    for name in sorted(os.environ):
        if name.startswith("SPECTRACE"):
            h.update(f"{name}={os.environ[name]}\0".encode())
    return h.hexdigest()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


class DemoCache:
    """Scenario results and the reference fingerprint, built at most once under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self._digest: str | None = None

    def _key(self, *parts: object) -> str:
        if self._digest is None:
            self._digest = source_digest()
        return hashlib.sha256(repr((self._digest, *parts)).encode()).hexdigest()[:20]

    def _built(self, label: str, key: str, build: Callable[[Path], T]) -> tuple[Path, T]:
        """(the folder, the value) for ``key``: built by ``build(folder)`` unless already on disk."""
        final = self.root / f"{label}-{key}"
        with _locked(self.root / f"{label}-{key}.lock"):
            if not (final / "value.pickle").is_file():
                staging = Path(tempfile.mkdtemp(prefix=f".{label}-", dir=self.root))
                try:
                    value = build(staging)
                    (staging / "value.pickle").write_bytes(pickle.dumps(value))
                except BaseException:
                    shutil.rmtree(staging, ignore_errors=True)  # the next test that asks builds it again
                    raise
                os.rename(staging, final)  # whole or absent: a reader never sees half a build
        return final, pickle.loads((final / "value.pickle").read_bytes())

    def reference(self) -> Any:
        """``spectrace.demo.reference_fingerprint()``."""
        from spectrace.demo import reference_fingerprint

        return self._built("reference", self._key("reference"), lambda _: reference_fingerprint())[1]

    def run(self, name: str, out: Path, *, reference: bool = True, **kwargs: Any) -> Any:
        """As ``run_scenario(name, str(out), reference_fingerprint() if reference else None, **kwargs)``:
        the trace lands in ``out/name`` and the ScenarioResult says so."""
        from spectrace.demo import run_scenario

        def build(folder: Path) -> Any:
            return run_scenario(name, str(folder), self.reference() if reference else None, **kwargs)

        folder, result = self._built(f"scenario-{name}", self._key("scenario", name, reference, sorted(kwargs.items())), build)
        trace_dir = Path(out) / name
        if trace_dir.exists():
            shutil.rmtree(trace_dir)  # as run_scenario: a re-run replaces the scenario's trace
        shutil.copytree(folder / name, trace_dir)
        return dataclasses.replace(result, trace_dir=str(trace_dir))
