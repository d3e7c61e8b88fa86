"""Apply vLLM's patch points on its modules, as they import (or now, if they are imported).

vLLM has no hook registry: every route in (the ``vllm.general_plugins`` entry point, the
``.pth`` bootstrap, :func:`spectrace.integrations.vllm.install`) ends in this engine's
:class:`~..core.patcher.Patcher`, and none patches twice. vLLM's own choice: a point is
held by any wrapper running its hook (``one_per="hook"``). Model Runner V2 imports
``set_eagle3_aux_hidden_state_layers`` by name, so the runner's binding may be the
wrapper already; a target's override that delegates to ``SupportsEagle3``'s method
records one capture, not two.

A point missing from the installed vLLM is said once as "not covered" (unless an
alternative of its feature is patched); the host's call is never changed or broken.
"""

from __future__ import annotations

from ..core.patcher import Patcher
from . import state
from .points import TABLE

MARK = "__spectrace_vllm__"
PATCHER = Patcher(engine="vLLM", table=TABLE, state=state.SHARED, mark=MARK, one_per="hook")

# The import-hook callback named by the point table, and what install() and tests call.
patch_module, patch_point, is_patched = PATCHER.patch_module, PATCHER.patch_point, PATCHER.is_patched
install, install_direct, not_covered, applied = PATCHER.install, PATCHER.install_direct, PATCHER.not_covered, PATCHER.applied_routes
