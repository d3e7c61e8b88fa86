"""The hooks themselves: what runs at each call of a traced module.

Hooks stay cheap: inside a step a hook keeps the call as it came (``Tracer._keep``, read
later in one pass: :mod:`.kept_calls`), and only a call that cannot be kept is noted at
once (:mod:`.noting`). A module whose class can be wrapped gets one ``around`` function
(:mod:`.callwrap`) instead of torch's pre- and post-hooks. A hook never raises into the
model: every failure is a counted ``internal_error``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

from .graph_branch import capturing as _capturing
from .module_view import ModuleView
from .step_state import KEPT_DTYPES, NO_INPUTS, UNTRACED
from .stepwrap import untraceable
from .tensors import collect
from .tracer_base import TracerBase


class HookMaking(TracerBase):
    """Makes each hooked module's pre-hook, post-hook and class-wrapper call."""

    def _make_pre_hook(
        self,
        name: str,
        owner: Any = None,
        module_type: str = "",
        role: str | None = None,
        view: ModuleView | None = None,
        compile_checked: bool = False,
    ) -> Callable[..., None]:
        inputs_of = view.inputs if view is not None else None
        keep = view is None and self.stats_mode == "basic"  # see engine.PENDING_CALLS

        def pre_hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if owner is not None and owner() is not module:
                return None  # a deep copy's call: not the module this name belongs to
            if not compile_checked and untraceable():
                return None  # nothing of ours in a compiled, exported or jit-traced graph (see Tracer._compiled)
            try:
                local = self._local.__dict__
                state = local.get("steps") or self._thread()
                if state.warming:
                    return
                stack = local.get("inputs")
                if stack is None:
                    stack = local["inputs"] = []
                if state.untraced and local.get("depth", 0):
                    # Counted by the post-hook. (At depth 0 a hooked root's step is not
                    # decided yet: its inputs are noted, and dropped if it is left out.)
                    stack.append(UNTRACED)
                    return
                if (
                    keep
                    and state.stats.defer  # no engine's unversioned in-place kernels (Tracer.defer_stats)
                    and self.defer_stats
                    and args
                    and type(args[0]) is torch.Tensor
                    and args[0].dtype in KEPT_DTYPES
                    and args[0].layout is torch.strided  # (a sparse one gets no statistics: the guard would miss)
                    and not args[0].is_inference()  # an inference tensor has no version counter
                    and not state.capturing
                    and local.get("depth", 0)
                    and name not in self._read_at_once
                ):
                    stack.append(args[0]._version)  # an int: the post-hook keeps the call for a later read
                    return None
                stack.append(NO_INPUTS)  # the post-hook pops one entry per call, whatever happens here
                if local.get("depth", 0) == 0:  # a hooked module called outside any wrapped root
                    state.capturing = _capturing()
                found = inputs_of(args, kwargs) if inputs_of is not None else collect(args, kwargs, side="input")
                stack[-1] = self._note(found, state, name, module_type, role)
            except Exception as exc:
                self.recorder.internal_error(f"pre-hook {name}: {type(exc).__name__}: {exc}")
            return None

        return pre_hook

    def _make_post_hook(
        self,
        name: str,
        module_type: str,
        root: str,
        owner: Any = None,
        role: str | None = None,
        view: ModuleView | None = None,
        inputs_after: bool = False,
        compile_checked: bool = False,
    ) -> Callable[..., None]:
        """The hook after the call; ``inputs_after``: it reads the inputs too (no pre-hook)."""
        outputs_of = view.outputs if view is not None else None
        inputs_of = view.inputs if view is not None else None
        # Kept for a later read (see engine.PENDING_CALLS): the generic walk, every call read.
        spec = (name, module_type, root, role) if view is None and self.stats_mode != "full" else None

        def post_hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
            if owner is not None and owner() is not module or not compile_checked and untraceable():
                return None
            try:
                local = self._local.__dict__
                state = local.get("steps") or self._thread()
                entry: Any = None
                popped = False
                if not inputs_after and not state.warming:
                    stack = local.get("inputs")
                    if stack and stack[-1] is UNTRACED:  # its pre-hook ran in a step left out
                        stack.pop()
                        if state.untraced:
                            state.seen += 1
                            return None
                        # (a hooked root: its pre-hook ran before this traced step opened)
                        entry, popped = NO_INPUTS, True
                if spec is not None and not popped and not inputs_after and not state.warming:  # the pre-hook pushed one
                    stack = local.get("inputs")
                    entry = stack.pop() if stack else []
                if (
                    spec is not None
                    and (type(entry) is int or inputs_after)
                    and not state.capturing
                    and not state.warming
                    and not state.untraced
                    and local.get("depth", 0)
                ):
                    self._keep(state, spec, args, kwargs, output, None if inputs_after else entry)
                    return None
                if not state.warming and state.untraced:
                    # A call begun in a traced step that ends in one left out: counted, its
                    # pre-hook's entry dropped (spec's was popped above).
                    if spec is None and not inputs_after and not popped:
                        stack = local.get("inputs")
                        if stack:
                            stack.pop()
                    state.seen += 1
                    return None
                items = outputs_of(output, args, kwargs) if outputs_of is not None else None
                plain = None
                if items is None:
                    plain = collect((), None, output, side="output")
                    if state.warming:
                        items = [(arg, t, None, None) for arg, t in plain]
                if state.warming:
                    self._warm(items)  # the pre-hook kept nothing
                    return None
                if inputs_after:
                    found = inputs_of(args, kwargs) if inputs_of is not None else collect(args, kwargs, side="input")
                    inputs = self._note(found, state, name, module_type, role)
                elif entry is not None:
                    inputs = entry if type(entry) is list else []  # popped above (a kept call's int lost its state)
                else:
                    stack = local.get("inputs")
                    inputs = stack.pop() if stack else []
                self._finish_call(name, module_type, root, role, inputs, items, plain)
            except Exception as exc:
                self.recorder.internal_error(f"post-hook {name}: {type(exc).__name__}: {exc}")
            return None

        return post_hook

    def _make_around(
        self,
        name: str,
        module_type: str,
        root: str,
        role: str | None,
        view: ModuleView | None,
        pre: Callable[..., None] | None,
        post: Callable[..., None],
    ) -> Callable[..., Any]:
        """A class-wrapped module's call in one piece (callwrap). A call kept for a later read
        (see engine.PENDING_CALLS) is noted and kept here, with no hook called: in statistics mode
        its first input's version before the call, then the call; shapes only keeps the call.
        Any other call runs the pre-hook, the forward and the post-hook. Each hook costs
        more here than in a loop (cold, between the model's kernels): one entry, not three.
        With sampling, a call of a step that is left out runs the forward alone and is
        counted; a traced step's calls are kept as without sampling."""
        spec = (name, module_type, root, role)
        keeps = view is None and self.stats_mode != "full"
        local_of = self._local

        keep = self._keep

        def around_hooks(module: nn.Module, original: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            if pre is not None:
                pre(module, args, kwargs)
            output = original(module, *args, **kwargs)
            post(module, args, kwargs, output)
            return output

        if not keeps:
            return around_hooks

        if pre is None:  # shapes only: the inputs are read with the call, after it

            def around_shapes(module: nn.Module, original: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
                output = original(module, *args, **kwargs)
                try:
                    local = local_of.__dict__
                    state = local.get("steps")
                    if state is not None and not state.capturing and not state.warming and local.get("depth", 0):
                        if state.untraced:
                            state.seen += 1  # an unsampled step: counted, nothing collected
                            return output
                        keep(state, spec, args, kwargs, output, None)
                        return output
                except Exception as exc:
                    self.recorder.internal_error(f"post-hook {name}: {type(exc).__name__}: {exc}")
                    return output
                post(module, args, kwargs, output)
                return output

            return around_shapes

        # (here the mode is "basic": "full" keeps no call, shapes only has no pre-hook)

        def around_stats(module: nn.Module, original: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            state = None
            unsampled = False
            try:
                local = local_of.__dict__
                state = local.get("steps")
                if state is not None and state.untraced and not state.capturing and not state.warming and local.get("depth", 0):
                    state.seen += 1  # an unsampled step: counted, nothing collected
                    unsampled = True
                x = args[0] if args else None
                if unsampled or not (
                    state is not None
                    and type(x) is torch.Tensor
                    and state.stats.defer  # (the pre-hook's conditions for keeping a call)
                    and self.defer_stats
                    and not state.capturing
                    and not state.warming
                    and local.get("depth", 0)
                    and x.dtype in KEPT_DTYPES
                    and x.layout is torch.strided
                    and not x.is_inference()
                    and name not in self._read_at_once
                ):
                    state = None
            except Exception:
                state = None
            if unsampled:
                return original(module, *args, **kwargs)
            if state is None:
                return around_hooks(module, original, args, kwargs)
            version = x._version
            output = original(module, *args, **kwargs)
            try:
                if state.capturing or state.warming or not local.get("depth", 0):
                    # The call changed the step's state (rare): the post-hook decides, as it
                    # would after the pre-hook kept the version.
                    if not state.warming:
                        stack = local.get("inputs")
                        if stack is None:
                            stack = local["inputs"] = []
                        stack.append(version)
                    post(module, args, kwargs, output)
                else:
                    keep(state, spec, args, kwargs, output, version)
            except Exception as exc:
                self.recorder.internal_error(f"post-hook {name}: {type(exc).__name__}: {exc}")
            return output

        return around_stats
