"""What ``spectrace-bootstrap.pth`` calls at interpreter start when ``SPECTRACE`` is on.

The ``.pth`` line itself only reads the variable: with ``SPECTRACE`` unset it imports
nothing (not even this module), so an installed but unused spectrace costs one
dictionary lookup per interpreter start. When on, :func:`activate` hands over to
:func:`spectrace.runtime.activate`, which installs import hooks and nothing heavier.
A broken install prints one line and never stops the user's program.
"""

from __future__ import annotations

import sys


def activate() -> None:
    try:
        from .runtime import activate as activate_runtime

        activate_runtime()
    except Exception as exc:
        sys.stderr.write(f"spectrace: warning: SPECTRACE=1 but activation failed: {type(exc).__name__}: {exc}\n")
