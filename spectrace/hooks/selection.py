"""Which modules to hook: name globs, module types, or a named profile.

Globs match dotted module names in the one dialect of :mod:`spectrace.rules.globs`
(``*`` within one name part, ``**`` across dots). A profile is a named list of globs.

    >>> select(model, patterns=["model.layers.*", "lm_head"])
    [('model.layers.0', ...), ..., ('lm_head', ...)]
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Union

import torch.nn as nn

from ..rules.globs import glob_match

# The named profiles live with the other rules (torch-free: `spectrace settings` shows them);
# settings.PROFILE_NAMES lists their names (SPECTRACE_PROFILE is checked before torch loads).
from ..rules.profiles import PROFILES

ModuleFilter = Union[str, Sequence[str], Callable[[str, nn.Module], bool], None]


def patterns_for(modules: ModuleFilter = None, profile: str | None = None) -> list[str] | None:
    """The glob list a selection means; None when ``modules`` is a callable."""
    if callable(modules) and not isinstance(modules, str):
        return None
    found: list[str] = []
    if isinstance(modules, str):
        found.append(modules)
    elif modules:
        found.extend(modules)
    if profile:
        if profile not in PROFILES:
            raise ValueError(f"unknown profile {profile!r}; known: {', '.join(sorted(PROFILES))}")
        found.extend(PROFILES[profile])
    if not found:
        found.extend(PROFILES["default"])
    return found


def select(
    root: nn.Module,
    modules: ModuleFilter = None,
    *,
    types: Iterable[Union[type, str]] = (),
    profile: str | None = None,
) -> list[tuple[str, nn.Module]]:
    """The ``(name, module)`` pairs under ``root`` to hook, in registration order."""
    type_list = tuple(types)
    patterns = patterns_for(modules, profile if (profile or not type_list) else None)
    chosen: list[tuple[str, nn.Module]] = []
    for name, module in root.named_modules():
        if not name:
            continue  # the root is traced by its step wrapper, not by a hook
        if _type_matches(module, type_list):
            chosen.append((name, module))
        elif patterns is None:
            if modules(name, module):  # type: ignore[operator]
                chosen.append((name, module))
        elif (modules or profile or not type_list) and any(glob_match(name, p) for p in patterns):
            chosen.append((name, module))
    return chosen


def _type_matches(module: nn.Module, types: tuple[Union[type, str], ...]) -> bool:
    for wanted in types:
        if isinstance(wanted, str):
            if type(module).__name__ == wanted:
                return True
        elif isinstance(module, wanted):
            return True
    return False
