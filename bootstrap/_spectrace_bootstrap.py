"""Run by ``spectrace-bootstrap.pth`` at every interpreter start.

Returns at once unless ``SPECTRACE`` is truthy: no import beyond ``os``, so an
installed but unused spectrace costs nothing measurable. When on, it hands over to
``spectrace.runtime.activate``, which installs import hooks and nothing heavier.
"""

import os

if os.environ.get("SPECTRACE", "").strip().lower() in ("1", "true", "yes", "on"):
    try:
        from spectrace.runtime import activate

        activate()
    except Exception as exc:  # a broken install must not stop the user's program
        import sys

        sys.stderr.write(f"spectrace: warning: SPECTRACE=1 but activation failed: {type(exc).__name__}: {exc}\n")
