"""Attaching a tracer to models and taking it off again.

:meth:`Attaching.attach` hooks the selected modules of a root (each module's name, role and
privacy scope decided here, once) and wraps the root's ``forward`` so that each outermost
call is a step (:mod:`.steps`); :meth:`Attaching.adopt` defers the hooks to a model's first
outermost call; :meth:`Attaching.detach` removes every hook and wrapper.
"""

from __future__ import annotations

import collections
import weakref
from typing import Any

import torch.nn as nn

from ..sinks.base import safe_text
from . import callwrap, hookdicts, stepwrap
from .module_view import ModuleView
from .privacy import ALL, SHARED, Scope, shared, token_scope
from .roles import role_of
from .selection import ModuleFilter, select
from .tracer_base import TracerBase

# What turned a traced root into a graph (stepwrap's kinds): its name, what it made.
GRAPH_MAKERS = {
    "compile": ("torch.compile", "compiled"),
    "export": ("torch.export", "exported"),
    "jit": ("torch.jit.trace", "jit-traced"),
}


class Attaching(TracerBase):
    """Hooking models' modules, wrapping their forwards, and undoing both."""

    def attach(
        self,
        root: nn.Module,
        modules: ModuleFilter = None,
        *,
        types: tuple[Any, ...] = (),
        profile: str | None = None,
        prefix: str = "",
    ) -> list[str]:
        """Hook the selected modules under ``root`` and wrap its forward; returns their names.

        Each module's role (:func:`.roles.role_of`: ``draft.fc``, ``target.layer[3]``, ...)
        is decided here, once, from the module tree; a ``prefix`` of ``draft`` or
        ``target`` (the key of a ``{"target": ..., "draft": ...}`` mapping) decides the side.
        """
        chosen = select(root, modules, types=types, profile=profile)
        names: list[str] = []
        if prefix.split("#")[0].lower() == "draft":
            self._sampler.drafts.add(root)  # (or a module's draft role, below)
        # Names enter records here: escaped once (a ModuleDict key may hold any str), so a
        # record of the module is always valid UTF-8 and says its name as the view does.
        root_name = safe_text(prefix or type(root).__name__)
        # A class's wrapper costs every untraced instance of it a lookup per call (about half
        # what it saves a traced one): only classes mostly traced here get one. A traced
        # lm_head or fc leaves nn.Linear alone, and the hundreds of projections with it.
        instances = collections.Counter(type(m) for m in root.modules())
        traced = collections.Counter(type(m) for _name, m in chosen)
        for name, module in chosen:
            if module in self._hooked:
                continue
            full = safe_text(f"{prefix}.{name}" if prefix else name)
            self._hooked[module] = full
            # Through the class's forward where it can be (callwrap: torch's hook path costs
            # more than our hooks); a root, or a module with a forward of its own, gets
            # torch's hooks.
            cls = type(module)
            wrapped = module is not root and instances[cls] - traced[cls] <= traced[cls] and callwrap.wrappable(module)
            # Copy-safe hook dicts; where that cannot be (the module held other hooks), a
            # deep copy carries our hooks, so they answer only to their own module.
            owner = None if wrapped or hookdicts.prepare(module) else weakref.ref(module)
            role = self._role(root, name, module, prefix)
            if role is not None:
                self.roles[full] = role
                if role.startswith("draft"):
                    self._sampler.drafts.add(root)  # never the lead of a loop while a target runs too
            scope = self._scope(root, name, prefix)
            if scope == ALL and shared(root, module):
                scope = SHARED  # one module called by every layer: no statistics, nothing remembered
            if scope is not None:
                self._token_scope[full] = scope
            view = self._view(full, module)
            # Shapes only: one hook, the inputs read after the call (a shape or dtype does
            # not change in the forward; a statistic may, so then the inputs are read before).
            shapes_only = self.stats_mode == "off"
            # (callwrap's wrapper asks torch.compiler.is_compiling() before calling them)
            post = hookdicts.mark(
                self._make_post_hook(
                    full, type(module).__name__, root_name, owner, role, view, inputs_after=shapes_only, compile_checked=wrapped
                )
            )
            pre = (
                None
                if shapes_only
                else hookdicts.mark(self._make_pre_hook(full, owner, type(module).__name__, role, view, compile_checked=wrapped))
            )
            if wrapped:
                around = self._make_around(full, type(module).__name__, root_name, role, view, pre, post)
                self._handles.append(callwrap.install(module, around, pre, post))
            else:
                if pre is not None:
                    self._handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
                self._handles.append(module.register_forward_hook(post, with_kwargs=True))
            names.append(full)
        if self.values is not None:
            self._hook_values(root, prefix)
        self._keep_replay(root, prefix)
        self.wrap_forward(root)
        return names

    def _keep_replay(self, root: nn.Module, prefix: str) -> None:
        """SPECTRACE_REPLAY: a draft's inputs and module outputs of a few forwards, kept beside
        the trace for ``spectrace replay`` (one draft per tracer), and the target's own
        next-token choices at the same rows for ``spectrace probe`` (one target per tracer)."""
        settings = self.recorder.settings
        if not settings.replay:
            return
        from .replay_capture import draft_parts, keep_replay, keep_target, target_parts

        try:
            if root in self._sampler.drafts and draft_parts(root) is not None:
                if self._replay is None:
                    self._replay = keep_replay(root, rows=settings.replay_rows, recorder=self.recorder)
            elif self._target_tap is None and target_parts(root) is not None:
                self._target_tap = keep_target(root, rows=settings.replay_rows, recorder=self.recorder)
            if self._target_tap is not None and self._replay is not None:
                self._target_tap.capture = self._replay  # it stops when the draft's capture is full
        except Exception as exc:  # never into the host
            self.recorder.internal_error(f"replay: {type(exc).__name__}: {exc}")

    def _hook_values(self, root: nn.Module, prefix: str) -> None:
        """The aux concat hands its output to the values capture (whatever the selection)."""
        values = self.values
        for name, module in root.named_modules():
            if name.rsplit(".", 1)[-1] != "aux_concat" or self._role(root, name, module, prefix) != "target.aux_concat":
                continue
            full = f"{prefix}.{name}" if prefix else name
            hookdicts.prepare(module)

            def offer(module: nn.Module, args: Any, output: Any, full: str = full) -> None:
                values.offer(output, self._thread().step, full)  # type: ignore[union-attr]

            self._handles.append(module.register_forward_hook(hookdicts.mark(offer)))

    def _view(self, name: str, module: nn.Module) -> ModuleView | None:
        if self.views is None:
            return None
        try:
            return self.views(name, module)
        except Exception as exc:
            self.recorder.internal_error(f"output view of {name}: {type(exc).__name__}: {exc}")
            return None

    def _scope(self, root: nn.Module, name: str, prefix: str) -> Scope | None:
        try:
            return token_scope(root, name, hint=prefix or None)
        except Exception as exc:  # privacy errs on the safe side: shapes only for this module
            self.recorder.internal_error(f"token scope of {name}: {type(exc).__name__}: {exc}")
            return ALL

    def _role(self, root: nn.Module, name: str, module: nn.Module, prefix: str) -> str | None:
        try:
            return role_of(root, name, module, hint=prefix or None)
        except Exception as exc:  # a role is a label: never a reason not to trace
            self.recorder.internal_error(f"role of {name}: {type(exc).__name__}: {exc}")
            return None

    def adopt(self, root: nn.Module, prefix: str, modules: ModuleFilter = None, profile: str | None = None) -> None:
        """Wrap ``root``'s forward now and hook its modules on its first outermost call.

        Auto-activation adopts every model as it is built; a model built inside another
        (a Hugging Face backbone inside its LM head class) is first called at depth > 0
        and so is traced as part of the outer one, not twice.
        """
        self._adopted[root] = (prefix, modules, profile)
        self.wrap_forward(root)

    def forget(self, root: nn.Module) -> None:
        """Leave ``root`` and the models adopted inside it untraced here: an explicit
        ``trace()`` holds them, and one model hooked by two tracers would be traced twice."""
        for module in root.modules():
            if self._adopted.pop(module, None) is not None:
                wrapped = self._wrapped.pop(module, None)
                if wrapped is not None:
                    try:
                        wrapped.remove()
                    except Exception:
                        pass

    def _attach_adopted(self, root: nn.Module) -> None:
        spec = self._adopted.pop(root, None)
        if spec is None:
            return
        prefix, modules, profile = spec
        try:
            self.attach(root, modules, profile=profile, prefix=prefix)
        except Exception as exc:
            self.recorder.internal_error(f"attach {prefix}: {type(exc).__name__}: {exc}")

    def wrap_forward(self, root: nn.Module) -> None:
        """Make every call of ``root.forward`` (direct or through ``__call__``) a step.

        The wrapper lives on the class, not the instance (:mod:`.stepwrap`): a deep copy
        or a pickle of ``root`` is untraced and runs its own weights.
        """
        if root in self._wrapped:
            return
        self._wrapped[root] = stepwrap.install(root, self._step)

    def _compiled(self, kind: str = "compile") -> None:
        """A traced root is being turned into a graph (stepwrap tells, at trace time): said once per kind."""
        what, made = GRAPH_MAKERS.get(kind, GRAPH_MAKERS["compile"])
        self.recorder.coverage(
            "not_covered",
            f"a traced model ran under {what}: its modules are not traced per module inside the {made} "
            f"region (the {made} graph is the untraced one); run it eagerly to trace it",
        )

    def detach(self) -> None:
        """Remove every hook and every forward wrapper (called from ``finally``)."""
        for handle in self._handles:
            try:
                handle.remove()
            except Exception:
                pass
        self._handles.clear()
        self._active = False
        for wrapped in self._wrapped.values():
            try:
                wrapped.remove()
            except Exception:
                pass
        self._wrapped.clear()
        self._hooked.clear()
        self.finish_step()
        self._worker.close()
