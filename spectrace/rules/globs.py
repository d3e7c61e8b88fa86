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


def closest(word: str, candidates: list[str], n: int = 3, cutoff: float = 0.6, margin: float = 0.05) -> list[str]:
    """The candidates nearest ``word`` (difflib's ratio), best first; only the near-best:
    ``fcc`` should suggest ``fc``, not every name that shares ``draft.model.``.

    >>> closest("vew", ["demo", "view", "diff"])
    ['view']
    """
    import difflib

    scored = sorted(((difflib.SequenceMatcher(None, word, c).ratio(), c) for c in dict.fromkeys(candidates)), reverse=True)
    best = scored[0][0] if scored else 0.0
    return [c for ratio, c in scored[:n] if ratio >= cutoff and ratio >= best - margin]


def closest_names(pattern: str, names: list[str], n: int = 3) -> list[str]:
    """Dotted names nearest ``pattern`` (a typo, a missing prefix), best first; a glob or a
    short name is compared by its last part too (``**.fcc`` and ``fcc`` find ``draft.model.fc``)."""
    found = closest(pattern, names, n)
    parts = pattern.split(".")
    # Then the names' tails of as many parts as the pattern (``layers.O``: ``layers.0``), then
    # their last parts alone.
    for depth in dict.fromkeys((len(parts), 1)):
        if found:
            break
        by_tail: dict[str, list[str]] = {}
        for name in names:
            by_tail.setdefault(".".join(name.split(".")[-depth:]), []).append(name)
        for near in closest(".".join(parts[-depth:]), list(by_tail), n):
            found += [name for name in by_tail[near] if name not in found]
    return found[:n]


def did_you_mean(near: list[str]) -> str:
    """``did you mean 'view'?`` (``'a' or 'b'`` for several), or '' for none."""
    return f"did you mean {' or '.join(repr(x) for x in near)}?" if near else ""
