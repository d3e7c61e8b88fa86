"""What the server was launched with: speculative algorithm and the draft's config.json.

Read through SGLang's public getters only: 0.5.23 publishes resolved namespaces
(``runtime_context.get_spec()``), 0.5.17 a global ``ServerArgs``
(``server_args.get_global_server_args()``). Neither is imported here if SGLang has
not imported it already, and any failure means "unknown", never an error.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

_SPEC_FIELDS = ("speculative_algorithm", "speculative_draft_model_path")


def spec_args() -> dict[str, Any]:
    """``{"speculative_algorithm": ..., "speculative_draft_model_path": ...}`` or ``{}``."""
    ctx = sys.modules.get("sglang.srt.runtime_context")
    if ctx is not None and hasattr(ctx, "get_spec"):
        try:
            spec = ctx.get_spec()
            return {name: getattr(spec, name, None) for name in _SPEC_FIELDS}
        except Exception:
            pass  # not published yet in this process
    sa = sys.modules.get("sglang.srt.server_args")
    getter = getattr(sa, "get_global_server_args", None) if sa is not None else None
    if getter is not None:
        try:
            args = getter()
            return {name: getattr(args, name, None) for name in _SPEC_FIELDS}
        except Exception:
            pass  # 0.5.23 keeps the name but raises; older: not set yet
    return {}


def algorithm() -> str | None:
    value = spec_args().get("speculative_algorithm")
    if value is None:
        return None
    return str(getattr(value, "name", value)).upper()


def draft_config_from_path(path: str | None) -> dict[str, Any] | None:
    """The raw config.json of a local draft directory (hub ids are not fetched)."""
    if not path:
        return None
    candidate = os.path.join(path, "config.json") if os.path.isdir(path) else path
    if not candidate.endswith(".json") or not os.path.isfile(candidate):
        return None
    try:
        with open(candidate, encoding="utf-8") as fh:
            data = json.load(fh)
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


def sglang_version() -> str | None:
    module = sys.modules.get("sglang")
    version = getattr(module, "__version__", None)
    if version:
        return str(version)
    try:
        from importlib.metadata import version as dist_version

        return dist_version("sglang")
    except Exception:
        return None
