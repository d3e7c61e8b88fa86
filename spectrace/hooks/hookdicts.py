"""Forward hooks that a copy or a pickle of the model does not carry.

torch keeps a module's hooks in ``module._forward_hooks`` / ``_forward_pre_hooks``, plain
dicts on the instance. ``copy.deepcopy`` copies them with the closures inside, so a copy
would report its calls under the original's names; ``pickle`` and ``torch.save`` fail on
a closure. Before the first spectrace hook goes on a module, its (still empty) hook dicts
are swapped for :class:`TracedHooks`, a dict that deep-copies and pickles as a plain
``OrderedDict`` without spectrace's entries: a copy or a saved model holds no trace of
spectrace, and loading one needs no spectrace installed.

A dict that already holds someone else's hooks is left as it is (their handles point at
it); :func:`dict_for` then says so, and the hooks themselves ignore any module but theirs.
"""

from __future__ import annotations

import collections
import copy
from typing import Any

HOOK_MARK = "__spectrace_hook__"
_DICTS = ("_forward_pre_hooks", "_forward_hooks")


def _ours(hook: Any) -> bool:
    return bool(getattr(hook, HOOK_MARK, False))


class TracedHooks(collections.OrderedDict):  # type: ignore[type-arg]
    """A hook dict that copies and pickles without spectrace's hooks."""

    def plain(self) -> collections.OrderedDict[Any, Any]:
        return collections.OrderedDict((k, v) for k, v in self.items() if not _ours(v))

    def __reduce__(self) -> Any:
        return (collections.OrderedDict, (), None, None, iter(self.plain().items()))

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        return copy.deepcopy(self.plain(), memo)


def prepare(module: Any) -> bool:
    """Swap ``module``'s empty hook dicts for :class:`TracedHooks`; False when one held
    other hooks already (then a copy keeps spectrace's hooks, inert, and a pickle fails)."""
    clean = True
    for attr in _DICTS:
        hooks = module.__dict__.get(attr)
        if isinstance(hooks, TracedHooks):
            continue
        if type(hooks) is collections.OrderedDict and not hooks:
            module.__dict__[attr] = TracedHooks()
        else:
            clean = False
    return clean


def mark(hook: Any) -> Any:
    setattr(hook, HOOK_MARK, True)
    return hook
