"""The tracing engine: forward hooks that turn module calls into ``call`` records.

A :class:`Tracer` hooks the selected modules of one or more roots and wraps each
root's ``forward`` (SGLang calls ``.forward()`` directly, so a hook on the root would
never fire). Each outermost root call is a *step*. Hooks stay cheap: inside a step a
hook keeps the call as it came, and the kept calls are noted in one pass (see
:data:`PENDING_CALLS`) as plain tuples (names, shapes, a statistics slot, see
:mod:`.readback`); at the step's end the statistics copy is enqueued and the step goes to
the :class:`.worker.RecordWorker`,
which builds the pydantic records and hands them to the
:class:`~spectrace.recorder.Recorder` off the host's thread.

A hook never raises into the model: every internal failure becomes a counted
``internal_error``. Hooks only read tensors, so outputs are bit-identical.

    >>> tracer = Tracer(recorder, stats="basic")
    >>> tracer.attach(model, modules=["model.layers.*"])
    >>> model(ids); tracer.detach()
"""

from __future__ import annotations

import collections
import functools
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.nn as nn

from ..recorder import Recorder
from ..records import Call
from ..sinks.base import safe_text
from . import callwrap, hookdicts, stepwrap
from .budget import StepBudget
from .call_text import RawCall, RawTensor, StepContext, call_fields, call_texts, dumps, dumps_core
from .graph_branch import capturing as _capturing
from .identity import ByIdentity
from .privacy import ALL, INPUTS, SHARED, Scope, TokenTensors, shared, token_scope
from .readback import Readback, StepStats
from .roles import role_of
from .selection import ModuleFilter, select
from .stepwrap import untraceable
from .tensor_stats import INDEX_DTYPES, stats_supported
from .tensors import MAX_TENSORS_PER_SIDE, collect, collect_kwargs
from .values import values_capture
from .worker import RecordWorker

# What a module's output view yields: (arg, tensor, tensor to add or None, column range or None).
# A decoder layer that returns (mlp_out, residual) is seen as their sum, the residual
# stream; a fused input as its chunks.
ViewItem = tuple[str, torch.Tensor, torch.Tensor | None, tuple[int, int] | None]


class ModuleView(NamedTuple):
    """How an integration reads one module's calls (either part None: the generic walk).

    ``inputs(args, kwargs)`` names the input tensors (an engine's batch metadata object is
    not walked field by field on every call); ``outputs(output, args, kwargs)`` the output
    tensors as :data:`ViewItem` (None: the generic walk for that call)."""

    inputs: Callable[[tuple[Any, ...], dict[str, Any]], list[tuple[str, torch.Tensor]]] | None = None
    outputs: Callable[[Any, tuple[Any, ...], dict[str, Any]], list[ViewItem] | None] | None = None


_DTYPE_NAMES: dict[Any, str] = {}
_DEVICE_NAMES: dict[Any, str] = {}


def _dtype_name(dtype: Any) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).replace("torch.", "")
    return name


def _device_name(device: Any) -> str:
    name = _DEVICE_NAMES.get(device)
    if name is None:
        name = _DEVICE_NAMES[device] = str(device)
    return name


def _device_of(tensor: torch.Tensor) -> str:
    # A plain CPU tensor says so without building a torch.device (a third of a shape note);
    # a subclass may report a device of its own, so it is asked.
    if type(tensor) is torch.Tensor and tensor.is_cpu:
        return "cpu"
    return _device_name(tensor.device)


def _describe(tensor: torch.Tensor, seen: dict[int, Any] | None = None) -> tuple[tuple[int, ...], str, str]:
    """A tensor's (shape, dtype name, device name) as a call record writes them; ``seen``
    keeps them by identity for a pass whose tensors are all held (ids stay unique)."""
    if seen is not None:
        hit = seen.get(id(tensor))
        if hit is not None and hit[0] is tensor:
            return hit[1]
    try:
        shape = tuple(tensor.shape)
    except Exception:  # nested/jagged tensors have no single shape
        shape = ()
    described = (shape, _DTYPE_NAMES.get(tensor.dtype) or _dtype_name(tensor.dtype), _device_of(tensor))
    if seen is not None:
        seen[id(tensor)] = (tensor, described, None)  # (None: whether it takes statistics, not asked yet)
    return described


def _engine_loaded() -> bool:
    """Whether a serving engine is imported here (see Tracer.defer_stats)."""
    import sys

    return "sglang" in sys.modules or "vllm" in sys.modules


def _device_busy(on_device: bool, capturing: bool, readback: Readback | None) -> Callable[[], bool] | None:
    """A probe of whether the work queued so far on the current CUDA stream still runs
    (an event query: never blocks). None off CUDA or while a graph is captured."""
    if not on_device or capturing or not torch.cuda.is_available():
        return None
    if readback is not None and readback.has_events():
        return readback.busy  # its copies were queued last: the same question, no new event
    try:
        event = torch.cuda.Event()
        event.record()
        return event.query
    except Exception:
        return None


class _ThreadSteps:
    """One thread's open step: threads sharing a model never mix their calls."""

    def __init__(self, step: int, defer: bool = False) -> None:
        self.step = step
        self.start_ns = 0
        self.capturing = False
        self.warming = False  # an engine's eager warm-up before a capture: compile, record nothing
        # A step that sampling leaves out (SPECTRACE_SAMPLE, SPECTRACE_BUDGET): its calls run
        # the module alone and are counted. Decided once, when the step opens.
        self.untraced = False
        self.context: StepContext | None = None
        self.on_device = False  # any traced tensor of this step lives on an accelerator
        self.calls: list[RawCall] = []
        self.seen = 0  # calls seen this step, added to the calls_seen counter at its end (one lock per step)
        self.stats = StepStats(defer=defer)
        self.skipped_seen = 0  # stats.skipped_modified already counted in the trace
        # Calls kept as they came, read in one pass later (Tracer._read_pending), and the
        # bytes of the outputs they keep alive.
        self.pending: list[_Pending] = []
        self.pending_bytes = 0


# A call kept for a later read: ((name, module_type, root, role), args, kwargs, output,
# t_unix, the first input's version before the call or None, the output tensor with
# statistics and its version after the call, or None). The versions prove at the read
# that the statistics see the values of the call (shapes only: none needed).
_Pending = tuple[tuple[str, str, str, "str | None"], Any, Any, Any, float, "int | None", "torch.Tensor | None", int]


class _FinishedStep:
    __slots__ = ("step", "calls", "start_ns", "end_ns", "readback")

    def __init__(self, step: int, calls: list[RawCall], start_ns: int, end_ns: int, readback: Readback | None) -> None:
        self.step, self.calls, self.start_ns, self.end_ns, self.readback = step, calls, start_ns, end_ns, readback


# First-input dtypes of a call kept for a later read in statistics mode (PENDING_CALLS):
# those that get statistics, so the guarded tensor is the one summarised.
_KEPT_DTYPES = frozenset({torch.float32, torch.float16, torch.bfloat16, torch.float64})
# What turned a traced root into a graph (stepwrap's kinds): its name, what it made.
_GRAPH_MAKERS = {
    "compile": ("torch.compile", "compiled"),
    "export": ("torch.export", "exported"),
    "jit": ("torch.jit.trace", "jit-traced"),
}


def _holds_mutable(args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> bool:
    """Whether a call got a list or a dict, which its caller may change after it (a kept
    call's walk would then see the later contents): such a call is read at once."""
    for value in args:
        if type(value) is list or type(value) is dict:
            return True
    if kwargs:
        for value in kwargs.values():
            if type(value) is list or type(value) is dict:
                return True
    return False


_NO_INPUTS: list[RawTensor] = []  # a call whose inputs could not be noted (never appended to)
# A call of a step left out by sampling: its pre-hook's entry on the inputs stack, so its
# post-hook pops one entry per call in every step, and a call that crosses from an untraced
# step into a traced one (a hooked root) is still matched.
_UNTRACED: list[RawTensor] = []

# A call inside a traced forward is kept as it came (its arguments and output, held) and
# read with the others in one pass: at the step's end, or once PENDING_CALLS calls or
# PENDING_BYTES of their outputs are held. The hooks then run a few lines, and the walk,
# the notes and the statistics launches run warm, in a loop, instead of cold between the
# model's kernels (where the same code costs about 2.4x more). Holding keeps at most
# PENDING_BYTES of outputs per thread alive a little longer. Statistics mode keeps a call
# only where the version counters can prove the read sees the call's values: the first
# input a float tensor (its version noted before the call) and the output one tensor
# (noted after); a module seen writing its input or output in place is read at once from
# then on (Tracer._read_at_once).
PENDING_CALLS = 64
PENDING_BYTES = 64 << 20
# Sampling by loop iteration: a lead that has not run for this many forwards of other models
# (a warm-up before another model's loop) gives way to the model running now.
LEAD_LAPSE = 64

GRAPH_DRAIN_EVERY = 8  # sampled replays per hand-off to the record worker (the ring holds 128)
GRAPH_OBSERVE_EVERY = 4  # graph read-backs per one the live checks see
_GRAPH_DRAIN: Any = _FinishedStep(-1, [], 0, 0, None)  # "read the landed graph copies" (a worker item)


def _landed(item: Any) -> bool:
    """Whether a queued step can be built without waiting on the device (a graph drain
    is left to the worker)."""
    return item is not _GRAPH_DRAIN and (item.readback is None or item.readback.ready())


class Tracer:
    """Hooks modules and produces one list of call records per step."""

    def __init__(self, recorder: Recorder, *, stats: str = "basic", sample: int = 1, budget: float = 0.0) -> None:
        self.recorder = recorder
        self._replay: Any = None  # SPECTRACE_REPLAY's capture of a draft (hooks/replay_capture.py)
        self.stats_mode = stats
        self.sample = max(1, sample)
        # SPECTRACE_BUDGET: the steps this tracer numbers are traced one in N, N measured
        # (budget.py); SPECTRACE_SAMPLE is then the smallest N.
        self.budget = StepBudget(budget, floor=self.sample) if budget > 0 else None
        self._sampling = self.sample > 1 or self.budget is not None  # some steps may be left out
        self._lead: weakref.ref[nn.Module] | None = None  # the model whose forwards start an iteration
        self._lead_untraced = False  # the current iteration's decision
        self._iterations = 0  # the lead's forwards so far
        self._since_lead = 0  # other models' forwards since the lead's last one
        self._drafts: weakref.WeakSet[nn.Module] = weakref.WeakSet()  # roots keyed draft or with draft roles
        self._marked: int | None = None  # the marked step (set_step) decided last
        # What the first step left out says (once; later ones are counted under it)
        if self.budget is not None:
            self._untraced_detail = (
                f"SPECTRACE_BUDGET={self.budget.fraction:.3g}: loop iterations are traced one in N, N measured to keep tracing "
                "under that share of an iteration; the other steps' calls are counted (calls_seen), not recorded "
                "(counted in steps_untraced)"
            )
        else:
            self._untraced_detail = (
                f"SPECTRACE_SAMPLE={self.sample}: one loop iteration in {self.sample} is traced; the other steps' calls are "
                "counted (calls_seen), not recorded (counted in steps_untraced)"
            )
        self.step = -1
        self.auto_step = True
        self._handles: list[Any] = []
        # By the object, not its id (identity.py): a model built after one was freed may reuse its id.
        self._wrapped: ByIdentity[stepwrap.Handle] = ByIdentity()
        self._active = True
        self._local = threading.local()
        self._seq = 0
        self._counter_lock = threading.Lock()
        self._hooked: ByIdentity[str] = ByIdentity()
        self.roles: dict[str, str] = {}  # hooked name -> its role, for those that have one (kept after detach)
        self._adopted: ByIdentity[tuple[Any, ...]] = ByIdentity()
        # Integrations (SGLang) plug in here; the engine itself knows no engine.
        self.context_of: Callable[[nn.Module, tuple[Any, ...], dict[str, Any]], StepContext | None] | None = None
        self.views: Callable[[str, nn.Module], ModuleView | None] | None = None  # per hooked module, at attach
        self.graph_slots: Any = None  # a hooks.graph_slots.GraphSlots: statistics inside captured graphs
        # Called with each call record's fields on the thread that builds them (live checks).
        self.observers: list[Callable[[dict[str, Any]], None]] = []
        self._graph_pending = 0
        self._graph_readouts = 0
        # Where records are built: "auto" = a CPU-only step inline; outside a serving engine
        # a device step with nothing to read back inline too, and the others queued for the
        # worker thread, the host building those whose statistics have landed at its later
        # steps' ends (RecordWorker.build_landed_here; the worker keeps what is left); under
        # a serving engine every device step on the worker. "always" = every step on the
        # worker (tests drive it on the CPU).
        self.offload = "auto"
        self._values_lock = threading.Lock()
        self._values: collections.OrderedDict[int, list[list[float] | None]] = collections.OrderedDict()  # worker side
        self._worker = RecordWorker(self._build_step, self._drop_step)
        # Privacy: no statistics of tensors that are a function of one token id (privacy.py).
        self.token_stats = bool(getattr(recorder.settings, "token_stats", False))
        # Batch the statistics launches of small accelerator tensors (readback.StepStats.defer).
        # Off under a serving engine: its custom kernels write in place without bumping a
        # tensor's version, so a held tensor could be read after the write unnoticed.
        self.defer_stats = True
        self._token_tensors = TokenTensors()
        self._token_refs = self._token_tensors.refs  # (the same dict for the tracer's life)
        # Hooked name -> which of its tensors are a function of the token ids alone, from
        # its place in the model (privacy.token_scope: layer 0's input norm and q/k/v, ...).
        self._token_scope: dict[str, Scope] = {}
        # Modules whose calls are read at their hooks (PENDING_CALLS): seen writing their input
        # or output in place, or a held tensor of theirs written before its batched launch.
        self._read_at_once: set[str] = set()
        # SPECTRACE_CAPTURE_VALUES: the fused draft input's first rows and their ids (values.py).
        self.values = values_capture(recorder)
        self._step = functools.partial(Tracer._step_around, self)
        self._step.compiled = self._compiled  # type: ignore[attr-defined]

    # ---------------------------------------------------------------- set-up
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
            self._drafts.add(root)  # (or a module's draft role, below)
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
                    self._drafts.add(root)  # never the lead of a loop while a target runs too
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
        the trace for ``spectrace replay`` (one draft per tracer)."""
        settings = self.recorder.settings
        if self._replay is not None or not settings.replay:
            return
        from .replay_capture import draft_parts, keep_replay

        try:
            if root in self._drafts and draft_parts(root) is not None:
                self._replay = keep_replay(root, rows=settings.replay_rows, recorder=self.recorder)
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
        what, made = _GRAPH_MAKERS.get(kind, _GRAPH_MAKERS["compile"])
        self.recorder.coverage(
            "not_covered",
            f"a traced model ran under {what}: its modules are not traced per module inside the {made} "
            f"region (the {made} graph is the untraced one); run it eagerly to trace it",
        )

    def _step_around(self, root: nn.Module, call: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not self._active:
            return call(*args, **kwargs)
        depth = self._depth()
        if self._adopted and depth == 0:
            self._attach_adopted(root)
        opened = self._open_step(depth, root)
        if opened and self.context_of is not None:
            state = self._thread()
            try:
                state.context = self.context_of(root, args, kwargs)
            except Exception as exc:
                state.context = None
                self.recorder.internal_error(f"step context: {type(exc).__name__}: {exc}")
        if depth == 0 and self.values is not None:  # an outermost forward, whoever numbers the steps
            self.values.note_root(args, kwargs)
        stack = self._local.__dict__.setdefault("inputs", [])
        pending = len(stack)  # a hooked root's own pre-hook ran before this wrapper
        try:
            return call(*args, **kwargs)
        finally:
            # Back to the depth this call found, whatever happened inside: a root called
            # inside another (an HF LM head around its backbone) must not leave it raised.
            self._local.depth = depth
            if depth == 0 and self.values is not None:
                self.values.end_root()
            if opened:
                # A module that raised inside left its inputs on the stack (no post-hook ran).
                del stack[pending:]
                budget = self.budget
                if budget is None:
                    self.finish_step(wait=False)  # no host sync inside the forward
                else:
                    began = time.perf_counter()
                    self.finish_step(wait=False)
                    budget.spent(time.perf_counter() - began)

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

    # ----------------------------------------------------------------- steps
    def _thread(self) -> _ThreadSteps:
        state = getattr(self._local, "steps", None)
        if state is None:
            state = self._local.steps = _ThreadSteps(self.step, defer=self.defer_stats and not _engine_loaded())
        return state

    def set_step(self, step: int) -> None:
        """Take over step numbering (a speculative loop marks its own steps). A step marked
        again (before its target and before its draft) keeps its first decision."""
        budget = self.budget
        began = time.perf_counter()
        self.finish_step(wait=False)
        if budget is not None and self._marked is not None:
            budget.spent(time.perf_counter() - began)  # (the step decided last: its end is its cost)
        self.auto_step = False
        self.step = step
        state = self._thread()
        state.step, state.start_ns = step, time.time_ns()
        state.capturing = _capturing()
        if step != self._marked:
            self._marked = step
            self._decide(state, self._untraced_at(step))

    def _depth(self) -> int:
        return getattr(self._local, "depth", 0)

    def _open_step(self, depth: int, root: nn.Module | None = None) -> bool:
        self._local.depth = depth + 1
        if depth == 0 and self.auto_step:
            with self._counter_lock:
                self.step += 1
                step = self.step
            state = self._thread()
            state.step, state.start_ns = step, time.time_ns()
            # Graphs are captured around whole forwards: one check per step, not per call.
            state.capturing = _capturing()
            if self._sampling:
                self._decide(state, self._iteration_untraced(root))
            return True
        return False

    def _iteration_untraced(self, root: nn.Module | None) -> bool:
        """Whether the step ``root`` opens is left out by sampling. Steps are sampled by loop
        iteration: the lead (a target, or the one model of a ``generate``) decides at each of
        its forwards, and the other models' forwards up to its next one follow. Counting every
        model's forwards alike would trace one model only in a loop that alternates two (a
        target and its draft) at an even interval.

        The lead is the first model to run, unless it is a draft (its modules have draft
        roles) and another model runs, or it has not run for :data:`LEAD_LAPSE` forwards of
        other models (a warm-up before another model's loop): then the model running now."""
        if root is None:
            return self._lead_untraced
        lead = self._lead() if self._lead is not None else None
        if lead is None or root is not lead and (self._since_lead >= LEAD_LAPSE or lead in self._drafts and root not in self._drafts):
            lead = root
            self._lead = weakref.ref(root)
        if root is lead:
            self._since_lead = 0
            self._lead_untraced = self._untraced_at(self._iterations)
            self._iterations += 1
        else:
            self._since_lead += 1
        return self._lead_untraced

    def _untraced_at(self, count: int) -> bool:
        """Whether the iteration (or marked step) numbered ``count`` is left out: the
        budget's decision, else every SAMPLE-th one is traced. Never raises (traced then)."""
        if self.budget is not None:
            try:
                return not self.budget.decide(time.perf_counter())
            except Exception as exc:
                self.recorder.internal_error(f"budget: {type(exc).__name__}: {exc}")
                return False
        return self.sample > 1 and count >= 0 and count % self.sample != 0

    def _decide(self, state: _ThreadSteps, untraced: bool) -> None:
        """Mark the step just opened as left out by sampling or not; say the first one once."""
        state.untraced = untraced
        if not untraced:
            return
        self.recorder.count("steps_untraced", 1)
        self.recorder.coverage("not_covered", self._untraced_detail, step=state.step)

    def finish_step(self, wait: bool = True) -> None:
        """End this thread's step: start its statistics copy and queue it for the worker.

        Nothing here waits for the device. With ``wait=True`` (anything about to read the
        trace) it then waits until the worker has turned every queued step into records.
        """
        state = self._thread()
        if state.pending:
            self._read_pending(state)
        calls, state.calls = state.calls, []
        on_device, state.on_device = state.on_device, False
        if state.seen:
            seen, state.seen = state.seen, 0
            self.recorder.count("calls_seen", seen)
        step, start, end = state.step, state.start_ns or time.time_ns(), time.time_ns()
        readback = None
        try:
            readback = state.stats.start_readback()
        except Exception as exc:
            self.recorder.internal_error(f"statistics readback: {type(exc).__name__}: {exc}")
        if state.stats.written_owners:
            # Their tensors were written while held for a batched launch: read and launched
            # at their calls from now on.
            self._read_at_once |= state.stats.written_owners
            state.stats.written_owners.clear()
        skipped = state.stats.skipped_modified - state.skipped_seen
        if skipped:
            state.skipped_seen += skipped
            self.recorder.count("stats_skipped_modified", skipped)
            self.recorder.coverage(
                "not_covered",
                "statistics skipped for tensors written in place after their call and before their statistics were "
                "taken (counted in stats_skipped_modified; their shapes are recorded; a module seen writing its input "
                "or output in place is read at its call from then on)",
                step=step,
            )
        if calls or readback is not None:
            # A step without calls may still hold the input statistics of a call that ends
            # in the next step: the worker keeps them by generation.
            item = _FinishedStep(step, calls, start, end, readback)
            # Outside a serving engine the host builds the steps whose statistics have
            # landed itself (RecordWorker.build_landed_here); the device is never waited for.
            here = self.offload == "auto" and not _engine_loaded()
            if ((not on_device and self.offload != "always") or (here and readback is None)) and self._worker.idle():
                # CPU only, or nothing to read back: built here, in order. (On the CPU the
                # host never waits on a device, so a second thread has no idle time to use
                # and would only contend for the GIL.)
                self._build_step(item, on_worker=False)
            elif here:
                # The worker is not woken for it: the host builds it at a later step's end,
                # or the worker does once the lag has passed.
                self._worker.submit(item, busy=_device_busy(on_device, state.capturing, readback), wake=False)
                self._worker.build_landed_here(_landed)
            else:
                self._worker.submit(item, busy=_device_busy(on_device, state.capturing, readback))
        if wait:
            if self.graph_slots is not None:
                self._drain_graphs(final=True)
            if not self._worker.flush():
                self.recorder.internal_error("record worker: flush timed out (records still queued)")

    # ------------------------------------------------------- graph read-backs
    def next_step(self) -> int:
        """A step number for a graph replay (the same counter as eager steps)."""
        with self._counter_lock:
            self.step += 1
            return self.step

    def graph_replayed(self) -> None:
        """A sampled replay's statistics copy was queued. Every few of them the worker turns
        the copies that have landed into records (it never waits for one; the rest wait for
        a later drain). One hand-off per copy cost the host a thread wake-up each."""
        self._graph_pending += 1
        if self._graph_pending >= GRAPH_DRAIN_EVERY:
            self._graph_pending = 0
            self._worker.submit(_GRAPH_DRAIN, busy=None)

    def _drain_graphs(self, final: bool = False) -> None:
        if final and not _capturing():
            try:
                if torch.cuda.is_available() and torch.cuda.is_initialized():
                    torch.cuda.synchronize()  # reading the trace now: let the last copies land
            except Exception:
                pass
        self._worker.submit(_GRAPH_DRAIN, busy=None)

    def _build_graphs(self) -> None:
        from .graph_records import readout_fields

        slots = self.graph_slots
        if slots is None:
            return
        for n, readout in enumerate(slots.poll()):
            if n:
                self._worker.pause_point()  # the host is awake again: step aside
            try:
                with self._counter_lock:
                    first = self._seq + 1
                    fields = readout_fields(readout, slots, first)
                    self._seq += len(fields)
                texts = []
                for i, f in enumerate(fields, 1):
                    texts.append(dumps(f))
                    if i % 4 == 0:
                        self._worker.pause_point()  # the host is awake again: step aside
                self._graph_readouts += 1
                # Live checks see one read-back in GRAPH_OBSERVE_EVERY: they vote over many
                # steps, and the worker's time is the host's GIL.
                if self.observers and self._graph_readouts % GRAPH_OBSERVE_EVERY == 1:
                    for f in fields:
                        self._observe(f)
                calls = [Call.model_validate(f) for f in fields] if self.recorder.needs_call_objects else []
                step = int(readout.context.get("step", -1))
                now = time.time_ns()
                self._emit_step(step, calls, now, now, texts)
            except Exception as exc:
                self.recorder.internal_error(f"graph read-back: {type(exc).__name__}: {exc}")

    def _observe(self, fields: dict[str, Any]) -> None:
        for observer in self.observers:
            try:
                observer(fields)
            except Exception as exc:
                self.recorder.internal_error(f"call observer: {type(exc).__name__}: {exc}")

    def _build_step(self, item: _FinishedStep, on_worker: bool = True) -> None:
        """Wait for the statistics, build the records, hand them on (on the worker thread,
        or inline for a CPU-only step)."""
        if item is _GRAPH_DRAIN:
            self._build_graphs()
            return
        if item.readback is not None:
            values: list[list[float] | None] = []
            if item.readback.error is not None:
                exc = item.readback.error
                self.recorder.internal_error(f"statistics readback: {type(exc).__name__}: {exc}")
            try:
                values = item.readback.values()
            except Exception as exc:
                self.recorder.internal_error(f"statistics readback: {type(exc).__name__}: {exc}")
            with self._values_lock:  # CPU steps of several threads may be built at once
                self._values[item.readback.generation] = values
                while len(self._values) > 64:
                    self._values.popitem(last=False)
        # JSON straight from the notes: the schema's field names, checked against the
        # pydantic model in tests/test_roles.py. Call objects are built only when a sink
        # needs them (the OpenTelemetry sink).
        objects = self.recorder.needs_call_objects
        calls: list[Call] = []
        texts: list[str] = []
        try:
            if not objects and not self.observers and dumps is dumps_core:
                # Only the JSON is wanted: written piece by piece, the same text (call_text.py).
                pause = self._worker.pause_point if on_worker else None  # the host is awake again: step aside
                self._emit_step(item.step, calls, item.start_ns, item.end_ns, call_texts(item.calls, self._values, pause))
                return
            for n, raw in enumerate(item.calls, 1):
                fields = call_fields(raw, self._values)
                texts.append(dumps(fields))
                if self.observers:
                    self._observe(fields)
                if objects:
                    calls.append(Call.model_validate(fields))
                if on_worker and n % 4 == 0:
                    self._worker.pause_point()  # the host is awake again: step aside
        except Exception as exc:
            self.recorder.count_dropped(len(item.calls), "record build")
            self.recorder.internal_error(f"record build: {type(exc).__name__}: {exc}")
            return
        self._emit_step(item.step, calls, item.start_ns, item.end_ns, texts)

    def _drop_step(self, item: _FinishedStep) -> None:
        if item is _GRAPH_DRAIN:
            return  # the copies stay in the ring: a later drain reads them
        self.recorder.count_dropped(len(item.calls), "record worker stuck")
        self.recorder.coverage("dropped", "call records dropped: the record worker was stuck for seconds (counted in records_dropped)")

    def _emit_step(self, step: int, calls: list[Call], start: int, end: int, texts: list[str] | None = None) -> None:
        count = len(texts) if texts is not None else len(calls)
        if not count:
            return
        try:
            self.recorder.emit_step(step, calls, start, end, texts)
        except Exception as exc:  # never raise, wherever it runs
            self.recorder.count_dropped(count, "step hand-off")
            self.recorder.internal_error(f"step hand-off: {type(exc).__name__}: {exc}")

    # ----------------------------------------------------------------- hooks
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
        keep = view is None and self.stats_mode == "basic"  # see PENDING_CALLS

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
                    stack.append(_UNTRACED)
                    return
                if (
                    keep
                    and state.stats.defer  # no engine's unversioned in-place kernels (Tracer.defer_stats)
                    and self.defer_stats
                    and args
                    and type(args[0]) is torch.Tensor
                    and args[0].dtype in _KEPT_DTYPES
                    and args[0].layout is torch.strided  # (a sparse one gets no statistics: the guard would miss)
                    and not args[0].is_inference()  # an inference tensor has no version counter
                    and not state.capturing
                    and local.get("depth", 0)
                    and name not in self._read_at_once
                ):
                    stack.append(args[0]._version)  # an int: the post-hook keeps the call for a later read
                    return None
                stack.append(_NO_INPUTS)  # the post-hook pops one entry per call, whatever happens here
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
        # Kept for a later read (see PENDING_CALLS): the generic walk, every call read.
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
                    if stack and stack[-1] is _UNTRACED:  # its pre-hook ran in a step left out
                        stack.pop()
                        if state.untraced:
                            state.seen += 1
                            return None
                        # (a hooked root: its pre-hook ran before this traced step opened)
                        entry, popped = _NO_INPUTS, True
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
        (see PENDING_CALLS) is noted and kept here, with no hook called: in statistics mode
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
                    and x.dtype in _KEPT_DTYPES
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

    def _keep(
        self, state: _ThreadSteps, spec: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any, version: int | None
    ) -> None:
        """Keep a call for the step's read (see PENDING_CALLS); ``version``: its first input's
        before the call, None in shapes-only mode (no version to prove)."""
        pending = state.pending
        if version is None:
            pending.append((spec, args, kwargs, output, time.time(), None, None, 0))
        elif type(output) is torch.Tensor and not output.is_inference():
            pending.append((spec, args, kwargs, output, time.time(), version, output, output._version))
        else:  # no output tensor whose version proves its values later: read now
            pending.append((spec, args, kwargs, output, time.time(), version, None, 0))
            self._read_pending_counted(state)
            return
        if type(output) is torch.Tensor:
            state.pending_bytes += output.nbytes
        if len(pending) >= PENDING_CALLS or state.pending_bytes > PENDING_BYTES or _holds_mutable(args, kwargs):
            self._read_pending_counted(state)  # (a list or dict argument may change before a later read)

    def _read_pending_counted(self, state: _ThreadSteps) -> None:
        """:meth:`_read_pending` from a hook, its time handed to the budget (its floor of a
        traced step's cost)."""
        budget = self.budget
        if budget is None:
            self._read_pending(state)
            return
        began = time.perf_counter()
        try:
            self._read_pending(state)
        finally:
            budget.spent(time.perf_counter() - began)

    def observe(self, name: str, module_type: str, role: str | None, items: list[ViewItem], root: str = "") -> None:
        """A call the engine did not see as a module call (a function an integration
        patched: SGLang's logits, its aux concat), recorded like one. Never raises."""
        try:
            self._finish_call(name, module_type, root, role, [], items)
        except Exception as exc:
            self.recorder.internal_error(f"observe {name}: {type(exc).__name__}: {exc}")

    def _finish_call(
        self,
        name: str,
        module_type: str,
        root: str,
        role: str | None,
        inputs: list[RawTensor],
        items: list[ViewItem] | None,
        plain: list[tuple[str, torch.Tensor]] | None = None,
    ) -> None:
        """One call's record note; its outputs either as an output view's ``items`` or, from
        the generic walk, as ``plain`` (arg, tensor) pairs."""
        local = self._local.__dict__
        state = local.get("steps") or self._thread()
        if state.pending:
            self._read_pending(state)  # the calls before this one come first
        if state.warming:
            if items is None:
                items = [(arg, t, None, None) for arg, t in plain or ()]
            self._warm(items)  # an engine's warm-up before capture: compile now, not mid-capture
            return
        state.seen += 1
        if state.untraced:
            return
        with self._counter_lock:
            self._seq += 1
            seq = self._seq
        outside = local.get("depth", 0) == 0  # a hooked module called outside any wrapped root
        if outside:
            state.capturing = _capturing()
        if plain is not None:
            outputs = self._note(plain, state, name, module_type, role, reuse=False, output=True)
        else:
            outputs = self._note_items(items or [], state, name, module_type, role)
        ctx = state.context
        state.calls.append((state.step, seq, name, module_type, root, inputs, outputs, time.time(), state.capturing, role, ctx))
        if state.capturing and self.graph_slots is None:
            self.recorder.coverage(
                "graph_replay",
                "modules ran under CUDA-graph capture: shapes recorded once, replays are not traced per module",
                step=state.step,
            )
        if self.auto_step and outside:
            self.finish_step(wait=False)  # flush per call

    def _read_pending(self, state: _ThreadSteps) -> None:
        """Note the calls the hooks kept (see PENDING_CALLS), in their order, as the hooks
        would have one by one; statistics only of tensors whose version is the call's."""
        pending, state.pending, state.pending_bytes = state.pending, [], 0
        with self._counter_lock:
            first = self._seq + 1
            self._seq += len(pending)
        state.seen += len(pending)
        # No model code runs until this pass ends: its CPU statistics are taken together.
        state.stats.batch_rows = True
        try:
            self._read_kept(state, pending, first)
        finally:
            state.stats.batch_rows = False
            try:
                state.stats.take_rows()
            except Exception as exc:
                self.recorder.internal_error(f"statistics of kept calls: {type(exc).__name__}: {exc}")

    def _read_kept(self, state: _ThreadSteps, pending: list[_Pending], first: int) -> None:
        step, capturing, ctx, calls, note = state.step, state.capturing, state.context, state.calls, self._note
        seen: dict[int, Any] = {}  # (see _describe) every tensor here is held: ids are unique
        # The keyword arguments' notes by the arguments' identities: the layers of a stack get
        # the same objects (rotary cos/sin, position ids, mask), walked and noted once a pass.
        # Only notes without statistics are kept: shapes only, or the positional arguments
        # took the one statistic of the side ("basic").
        kwarg_notes: dict[tuple[Any, ...], list[RawTensor]] = {}
        shapes_only = self.stats_mode == "off"
        for n, (spec, args, kwargs, output, t_unix, in_version, out, out_version) in enumerate(pending):
            name, module_type, root, role = spec
            try:
                guard = None
                if in_version is not None:
                    guard = (args[0], in_version)
                    if args[0]._version != in_version:
                        # The module wrote its input in place: its calls are read at once from now on.
                        self._read_at_once.add(name)
                # (one tensor argument, one tensor output: most calls; collect's answer without the call)
                found = [("input[0]", args[0])] if len(args) == 1 and type(args[0]) is torch.Tensor else collect(args, None, side="input")
                if not kwargs:
                    inputs = note(found, state, name, module_type, role, guard=guard, seen=seen)
                else:
                    room = MAX_TENSORS_PER_SIDE - len(found)
                    if shapes_only or (found and self._takes_stats(found[0][1], seen)):  # the side's statistic is taken
                        inputs = note(found, state, name, module_type, role, guard=guard, seen=seen)
                        key = (room, tuple(kwargs), tuple(map(id, kwargs.values())))
                        rest = kwarg_notes.get(key)
                        if rest is None:
                            rest = kwarg_notes[key] = note(
                                collect_kwargs(kwargs, room), state, name, module_type, role, budget=0, seen=seen
                            )
                        inputs = inputs + rest if inputs else rest
                    else:
                        found += collect_kwargs(kwargs, room)
                        inputs = note(found, state, name, module_type, role, guard=guard, seen=seen)
                guard = None
                if out is not None:
                    guard = (out, out_version)
                    if out._version != out_version:
                        self._read_at_once.add(name)  # its output is written in place after the call
                found = [("output", output)] if type(output) is torch.Tensor else collect((), None, output, side="output")
                outputs = note(found, state, name, module_type, role, reuse=False, guard=guard, seen=seen, output=True)
            except Exception as exc:
                self.recorder.internal_error(f"post-hook {name}: {type(exc).__name__}: {exc}")
                continue
            calls.append((step, first + n, name, module_type, root, inputs, outputs, t_unix, capturing, role, ctx))

    @staticmethod
    def _takes_stats(tensor: torch.Tensor, seen: dict[int, Any]) -> bool:
        """Whether :meth:`_note` gives ``tensor``, first of its side, the side's statistic
        ("basic"): its answers kept in ``seen`` as _note keeps them."""
        hit = seen.get(id(tensor))
        if hit is None or hit[0] is not tensor:
            _describe(tensor, seen)
            hit = seen[id(tensor)]
        if hit[1][1] in INDEX_DTYPES:
            return False
        supported = hit[2]
        if supported is None:
            supported = stats_supported(tensor)
            seen[id(tensor)] = (tensor, hit[1], supported)
        return supported

    def _warm(self, items: list[ViewItem]) -> None:
        slots = self.graph_slots
        if slots is None or self.stats_mode == "off":
            return
        for _arg, tensor, add, cols in items:
            if isinstance(tensor, torch.Tensor) and stats_supported(tensor):
                slots.warm(tensor, add=add, cols=cols)

    def _note_items(self, items: list[ViewItem], state: _ThreadSteps, name: str, module_type: str, role: str | None) -> list[RawTensor]:
        """An output view's tensors: plain ones as :meth:`_note` does; a sum or a column
        range as the tensor it stands for (built eagerly, or computed inside the graph)."""
        if all(add is None and cols is None for _a, _t, add, cols in items):
            return self._note([(arg, t) for arg, t, _add, _cols in items], state, name, module_type, role, reuse=False, output=True)
        noted: list[RawTensor] = []
        scope = None if self.token_stats else self._token_scope.get(name)
        private = not self.token_stats and (scope in (ALL, SHARED) or TokenTensors.is_token_module(role, module_type))
        for arg, tensor, add, cols in items:
            if private:
                # A token-only module's output (privacy.py): shape and dtype only, remembered
                # for the modules that take it next.
                if scope != SHARED:
                    self._token_tensors.remember(tensor)
                noted.append(self._shape_only(arg, tensor, state, cols))
                continue
            if not self.token_stats and self._token_tensors.holds(tensor):
                # A view of an embedding output (an integration remembered it): shape and
                # dtype only, in eager steps and in a captured graph alike (privacy.py).
                noted.append(self._shape_only(arg, tensor, state, cols))
                continue
            if state.capturing and self._graph_slot(tensor, state, name, module_type, role, arg, add, cols):
                noted.append(self._shape_only(arg, tensor, state, cols))
                continue
            view = tensor
            if not state.capturing and self.stats_mode != "off":
                if add is not None:
                    view = tensor + add
                if cols is not None:
                    view = view[..., cols[0] : cols[1]].contiguous()
            noted.extend(self._note([(arg, view)], state, name, module_type, role, budget=1, reuse=False, output=True))
        return noted

    def _shape_only(self, arg: str, tensor: torch.Tensor, state: _ThreadSteps, cols: tuple[int, int] | None) -> RawTensor:
        shape = tuple(tensor.shape)
        if cols is not None and shape:
            shape = (*shape[:-1], cols[1] - cols[0])
        return (arg, shape, _dtype_name(tensor.dtype), _device_of(tensor), state.stats.generation, -1, 0)

    def _graph_slot(
        self,
        tensor: torch.Tensor,
        state: _ThreadSteps,
        name: str,
        module_type: str,
        role: str | None,
        arg: str,
        add: torch.Tensor | None = None,
        cols: tuple[int, int] | None = None,
    ) -> bool:
        """Statistics of ``tensor`` as kernels inside the graph being captured (True if it took a slot)."""
        slots = self.graph_slots
        if slots is None or self.stats_mode == "off" or slots.capturing_table() is None:
            return False
        ctx = state.context
        try:
            return (
                slots.record(
                    tensor, name=name, role=role, module_type=module_type, arg=arg, draft_step=ctx[2] if ctx else None, add=add, cols=cols
                )
                is not None
            )
        except Exception as exc:
            self.recorder.internal_error(f"graph slot {name}: {type(exc).__name__}: {exc}")
            return False

    def _note(
        self,
        tensors: list[tuple[str, torch.Tensor]],
        state: _ThreadSteps,
        name: str = "",
        module_type: str = "",
        role: str | None = None,
        budget: int | None = -1,
        reuse: bool = True,
        guard: tuple[torch.Tensor, int] | None = None,
        seen: dict[int, Any] | None = None,
        output: bool = False,
    ) -> list[RawTensor]:
        """Shapes of every tensor, and statistics enqueued for the ones that get them
        (inside a graph being captured: a slot of its statistics table).

        ``guard``: (tensor, its version at the call) of a call read later; that tensor's
        statistics are skipped, and counted, if it was written in place since. ``seen``:
        the (shape, dtype, device) of tensors already noted in this pass, by identity
        (rotary cos/sin and position ids go to every layer; a layer's output is the next
        one's input). ``output``: the tensors are the call's outputs (a module whose
        inputs alone are token-only keeps its outputs' statistics)."""
        noted: list[RawTensor] = []
        generation = state.stats.generation  # a step ends in finish_step only: fixed here
        if self.stats_mode == "off":
            # Shapes only: the loop below without its statistics branch (the hottest path).
            for arg, tensor in tensors:
                shape, dtype, device = _describe(tensor, seen)
                if device != "cpu":
                    state.on_device = True
                noted.append((arg, shape, dtype, device, generation, -1, 0))
            return noted
        # "basic" summarises the first tensor of each side that statistics apply to (the
        # hidden states); "full" every tensor. Shapes are always recorded for all of them.
        # Rotary cos/sin, masks and ids repeat in every layer and would double the cost.
        if budget == -1:
            budget = None if self.stats_mode == "full" else 1
        # Privacy (privacy.py): a token-only module's tensors (an embedding's outputs, layer
        # 0's input norm and q/k/v, ...), and those same tensors seen again, get no
        # statistics (asked here, without a call per tensor).
        token_module = False
        keep_refs = True
        if not self.token_stats:
            scope = self._token_scope.get(name)
            token_module = scope in (ALL, SHARED) or (scope == INPUTS and not output) or TokenTensors.is_token_module(role, module_type)
            keep_refs = scope != SHARED
        token_refs = None if self.token_stats else self._token_refs  # (empty: nothing to ask per tensor)
        for arg, tensor in tensors:
            hit = seen.get(id(tensor)) if seen is not None else None
            matched = hit is not None and hit[0] is tensor
            described, supported = (hit[1], hit[2]) if matched else (_describe(tensor), None)
            shape, dtype, device = described
            index = -1
            numel = 0
            eligible = budget != 0 and dtype not in INDEX_DTYPES
            if eligible and supported is None:
                supported = stats_supported(tensor)
            if seen is not None and (not matched or supported is not hit[2]):
                # (a layer's output is the next one's input: described and asked once)
                seen[id(tensor)] = (tensor, described, supported)
            if eligible:
                if supported:
                    if budget is not None:
                        budget -= 1
                    if token_module:
                        if keep_refs:  # a function of the token ids alone: shape and dtype only
                            self._token_tensors.remember(tensor)
                    elif token_refs and self._token_tensors.holds(tensor):
                        pass  # an embedding output seen again
                    elif state.capturing:
                        # Nothing may be read back during capture; a slot in the graph instead.
                        self._graph_slot(tensor, state, name, module_type, role, arg)
                    else:
                        try:
                            if guard is not None and tensor is guard[0]:
                                if tensor._version == guard[1]:
                                    numel = tensor.numel()
                                    index = state.stats.add(tensor, reuse, version=guard[1], owner=name)
                                else:
                                    state.stats.skipped_modified += 1  # reported at the step's end
                            else:
                                numel = tensor.numel()
                                # A module seen writing in place launches at once, never held.
                                index = state.stats.add(tensor, reuse, owner=name, hold=name not in self._read_at_once)
                        except Exception as exc:
                            self.recorder.internal_error(f"statistic on {tensor.dtype}: {type(exc).__name__}: {exc}")
            if device != "cpu":
                state.on_device = True
            noted.append((arg, shape, dtype, device, generation, index, numel))
        return noted

    def remember_token_tensor(self, tensor: torch.Tensor) -> None:
        """An integration's word that ``tensor`` is a function of one token id each row
        (an embedding output it saw outside a module call): it gets no statistics."""
        self._token_tensors.remember(tensor)
