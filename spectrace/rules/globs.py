"""The one glob dialect for dotted module names (``trace(modules=...)``, assertions,
``spectrace view --module``).

``*`` stays within one name part, ``**`` crosses dots (and ``**.`` may match nothing),
``?`` is one character of a part: ``model.layers.*`` is each decoder layer and not every
linear inside it.

    >>> glob_match("model.layers.3", "model.layers.*"), glob_match("model.layers.3.mlp", "model.layers.*")
    (True, False)
    >>> suffix_match("draft.model.fc", "model.fc")
    True
"""

from __future__ import annotations

import functools
import re


@functools.lru_cache(maxsize=256)
def _compile(pattern: str) -> re.Pattern[str]:
    out = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**.", i):
            out.append(r"(?:.*\.)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(r".*")
            i += 2
        elif pattern[i] == "*":
            out.append(r"[^.]*")
            i += 1
        elif pattern[i] == "?":
            out.append(r"[^.]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    # DOTALL: a name part may hold any character, a newline too (``add_module("a\nb", ...)``):
    # ``**`` must match every name, never skip one silently.
    return re.compile("".join(out) + r"\Z", re.DOTALL)


def glob_match(name: str, pattern: str) -> bool:
    """Whether a dotted module name matches one glob."""
    return _compile(pattern).match(name) is not None


def suffix_match(name: str, pattern: str) -> bool:
    """:func:`glob_match` on the whole name or on any dotted suffix of it: roots differ
    between engines and traces (``draft.model.fc``, ``model.fc``, ``fc``)."""
    parts = name.split(".")
    return any(glob_match(".".join(parts[i:]), pattern) for i in range(len(parts)))
