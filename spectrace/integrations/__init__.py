"""Integrations with model libraries and engines; they import the core, never the reverse.

Each integration registers the modules whose import it waits for (``SPECTRACE=1``): the
core's runtime asks :func:`import_targets` and names none of them itself.
"""

from __future__ import annotations


def import_targets() -> list[tuple[str, str]]:
    """``(module to wait for, "package.module:function" to run once it is imported)`` of every
    integration; reading it imports only the integrations' tables."""
    from .sglang.points import import_targets as sglang_targets
    from .transformers_targets import IMPORT_TARGETS as transformers_targets
    from .vllm.points import import_targets as vllm_targets

    return [*transformers_targets, *sglang_targets(), *vllm_targets()]


# The engines' own packages: where one is loaded, the engine's processes adopt its models,
# and a process of it that builds none (a tokenizer, a launcher) is not a program whose
# model spectrace failed to know.
ENGINE_PACKAGES: tuple[str, ...] = ("sglang", "vllm")
