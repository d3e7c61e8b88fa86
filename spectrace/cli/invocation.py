"""How the user can type ``spectrace`` again, for the commands a screen tells them to run next.

``bash scripts/demo.sh`` runs ``.venv/bin/spectrace`` with the virtual environment not
activated: a closing line that says ``spectrace view ...`` would fail with "command not
found". The command is ``spectrace`` when that name on PATH is this very program; else
the path it was started by (``.venv/bin/spectrace``), or the console script beside the
interpreter (``python -m spectrace``), or ``python -m spectrace`` itself.

    how = invocation()   # run as .venv/bin/spectrace, spectrace not on PATH:
    how.command          # '.venv/bin/spectrace'
    how.hint             # 'spectrace is not on PATH: run .venv/bin/spectrace as below, or first: source .venv/bin/activate'
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from dataclasses import dataclass

NAME = "spectrace"


@dataclass(frozen=True)
class Invocation:
    command: str  # what to type: ``spectrace``, ``.venv/bin/spectrace``, ``/usr/bin/python3 -m spectrace``
    hint: str | None = None  # one line for a command that is not on PATH: how to put it there


def _same(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def invocation(argv0: str | None = None, executable: str | None = None, path: str | None = None) -> Invocation:
    """How to run spectrace from the user's shell (the arguments default to this process's)."""
    argv0 = sys.argv[0] if argv0 is None else argv0
    executable = sys.executable if executable is None else executable
    on_path = shutil.which(NAME, path=path if path is not None else os.environ.get("PATH"))
    if os.path.splitext(os.path.basename(argv0))[0] == NAME and os.path.isfile(argv0):
        script, typed = argv0, argv0  # the console script, as the user (or demo.sh) typed it
    else:  # python -m spectrace: its console script sits beside the interpreter, if installed
        script = os.path.join(os.path.dirname(executable), NAME)
        typed = script
    if on_path is not None and _same(on_path, script):
        return Invocation(NAME)
    if not os.path.isfile(script):
        return Invocation(f"{shlex.quote(executable)} -m {NAME}")
    command = shlex.quote(typed)
    activate = os.path.join(os.path.dirname(typed), "activate")
    where = f"the {NAME} on PATH ({on_path}) is another install" if on_path else f"{NAME} is not on PATH"
    hint = f"{where}: run {command} as below"
    if os.path.isfile(activate):
        hint += f", or first: source {shlex.quote(activate)}"
    return Invocation(command, hint)
