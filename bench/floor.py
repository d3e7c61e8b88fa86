"""What the least a Python tracer can do costs per hooked call, beside spectrace, in one run.

    python bench/floor.py [--repeats 7] [--json FILE]
    python bench/floor.py --device cuda          # the same on a GPU machine's host

The tiny Llama of ``bench/host_cost.py`` (8 layers, hidden 64, 16 tokens), its calls seen
on the modules spectrace hooks (11), by the cheapest means per module: the module's class
``forward`` replaced where every instance of that class is hooked (spectrace's class
wrapper does the same), torch's forward hooks otherwise. Each variant does a little more:

- ``empty``: the calls are seen and nothing is done (the means alone);
- ``note``: each call's tensor arguments (positional and keyword, a tuple of tensors one
  level down) and its output described (shape, dtype, device) with the time: what a
  shapes-only record holds, written nowhere. A tensor object is described once a step
  (the layers of a stack get the same rotary cos/sin, ids and masks), as spectrace does;
- ``note_text``: and at the step's end one JSON line per call (f-strings, the dtype and
  device names cached), handed to a list as a sink would take it;
- ``stats_text``: each call's output kept; at the step's end its statistics (sum, sum of
  squares, absmax) for the outputs of one size together (one copy and four reductions a
  size, read to the host), and the JSON lines. On CUDA each size's read waits for the
  device (a tracer that never syncs pays more host work to avoid that).

Then spectrace shapes only and statistics. Beside each wall figure, its accounting: the
time inside the hooks and the step's end alone, each wrapped in a timer (for spectrace,
the hooks' own accounting of ``bench/host_cost.py``). The variants run in rotating order
each repeat, between a bare forward and the bare forward again (the control: its
difference to bare is the noise of the wall figures). A figure is (variant - bare of the
same repeat) / hooked calls, the median over repeats with its IQR.

The floor variants record less than spectrace does: no step, sequence, role or root, no
statistics of an input, no guard against a tensor written in place, no coverage. They are the work
any tracer of these calls does, not a tracer to use.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from host_cost import HookClock, accounted_per_step, per_step  # noqa: E402
from overhead import machine, quartiles  # noqa: E402

import spectrace  # noqa: E402
from spectrace.eagle3.target import tiny_llama  # noqa: E402

Action = Callable[[str, tuple[Any, ...], dict[str, Any], Any], None]

FLOORS = ("empty", "note", "note_text", "stats_text")
TRACED = ("spectrace_off", "spectrace_basic")


class Seen:
    """Every call of ``modules`` handed to ``action(name, args, kwargs, output)``: through the class's
    ``forward`` where all of the model's instances of that class are in ``modules``, through
    torch's forward hooks otherwise. ``remove()`` puts everything back."""

    def __init__(self, model: torch.nn.Module, modules: dict[str, torch.nn.Module], action: Action) -> None:
        self._classes: dict[type, Any] = {}
        self._handles: list[Any] = []
        names = {id(m): n for n, m in modules.items()}
        instances: dict[type, int] = {}
        for m in model.modules():
            instances[type(m)] = instances.get(type(m), 0) + 1
        hooked: dict[type, int] = {}
        for m in modules.values():
            hooked[type(m)] = hooked.get(type(m), 0) + 1
        for name, m in modules.items():
            cls = type(m)
            if hooked[cls] == instances[cls] and "forward" not in m.__dict__:
                if cls not in self._classes:
                    self._classes[cls] = cls.__dict__.get("forward")
                    cls.forward = self._wrapper(cls.forward, names, action)  # type: ignore[method-assign]
            else:
                self._handles.append(m.register_forward_hook(lambda _m, a, k, o, n=name: action(n, a, k, o), with_kwargs=True))

    @staticmethod
    def _wrapper(original: Callable[..., Any], names: dict[int, str], action: Action) -> Callable[..., Any]:
        def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
            output = original(self, *args, **kwargs)
            name = names.get(id(self))
            if name is not None:
                action(name, args, kwargs, output)
            return output

        return forward

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        for cls, own in self._classes.items():
            if own is None:
                del cls.forward
            else:
                cls.forward = own  # type: ignore[method-assign]


class Floor:
    """The floor variants' hooks and step ends (see the module's docstring)."""

    def __init__(self) -> None:
        self.notes: list[tuple[Any, ...]] = []
        self.seen: dict[int, tuple[Any, ...]] = {}  # a step's tensors described so far, by identity
        self.lines: list[str] = []
        self._names: dict[Any, str] = {}

    def name(self, value: Any) -> str:
        text = self._names.get(value)
        if text is None:
            text = self._names[value] = str(value)
        return text

    def empty(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        pass

    def describe(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[Any, ...]]:
        """(arg, shape, dtype, device) of a call's tensor arguments; an object seen before
        in this step is not asked again (rotary cos/sin, ids, masks: every layer gets the
        same ones)."""
        described = []
        seen = self.seen
        for a, x in tensors_of(args, kwargs):
            hit = seen.get(id(x))
            if hit is None or hit[0] is not x:
                hit = seen[id(x)] = (x, tuple(x.shape), x.dtype, x.device)
            described.append((a, *hit[1:]))
        return described

    def note(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        self.notes.append((name, self.describe(args, kwargs), (tuple(output.shape), output.dtype, output.device), time.time()))

    def keep(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        self.notes.append((name, args, kwargs, output, time.time()))

    def drop(self) -> None:
        self.notes.clear()
        self.seen.clear()

    def _tensor(self, arg: str, shape: Any, dtype: Any, device: Any, stats: str) -> str:
        n = self.name
        return f'{{"arg":"{arg}","shape":{list(shape)},"dtype":"{n(dtype)}","device":"{n(device)}","stats":{stats}}}'

    def _line(self, name: str, inputs: list[tuple[Any, ...]], output: tuple[Any, ...], t: float, stats: str) -> str:
        described = ",".join(self._tensor(*x, "null") for x in inputs)
        return f'{{"module":"{name}","inputs":[{described}],"outputs":[{self._tensor("output", *output, stats)}],"t":{t!r}}}'

    def text(self) -> None:
        # (handed on as a sink would take them: the last step's lines stay in ``lines``)
        self.lines = [self._line(name, inputs, output, t, "null") for name, inputs, output, t in self.notes]
        self.notes.clear()
        self.seen.clear()

    def stats_text(self) -> None:
        kept = self.notes
        by_size: dict[int, list[int]] = {}
        for i, (_name, _args, _kwargs, out, _t) in enumerate(kept):
            if out.is_floating_point():
                by_size.setdefault(out.numel(), []).append(i)
        rows: list[str] = ["null"] * len(kept)
        for indices in by_size.values():
            stacked = torch.cat([kept[i][3].reshape(-1).float() for i in indices]).view(len(indices), -1)
            sums = torch.stack((stacked.sum(1), torch.linalg.vecdot(stacked, stacked), stacked.abs().amax(1)), 1).tolist()
            for i, (total, squares, top) in zip(indices, sums):
                rows[i] = f"[{total!r},{squares!r},{top!r}]"
        lines = []
        for (name, args, kwargs, out, t), row in zip(kept, rows):
            inputs = self.describe(args, kwargs)
            lines.append(self._line(name, inputs, (out.shape, out.dtype, out.device), t, row))
        self.lines = lines
        kept.clear()
        self.seen.clear()


def tensors_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[str, torch.Tensor]]:
    """A call's tensor arguments, a tuple of them one level down included (rotary cos/sin)."""
    found: list[tuple[str, torch.Tensor]] = []
    for key, value in (*((f"input[{i}]", a) for i, a in enumerate(args)), *kwargs.items()):
        if type(value) is torch.Tensor:
            found.append((key, value))
        elif type(value) is tuple:
            found.extend((f"{key}[{j}]", v) for j, v in enumerate(value) if type(v) is torch.Tensor)
    return found


def hooked_modules(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The modules spectrace hooks on ``model`` (its own choice, asked once)."""
    with spectrace.trace(model, stats="off") as t:
        names = list(t.hooked)
    found = dict(model.named_modules())
    return {n: found[n] for n in names}


def one(model: torch.nn.Module, ids: torch.Tensor, modules: dict[str, torch.nn.Module], iters: int, order: int) -> dict[str, float]:
    """One repeat: bare, every variant in rotating order, bare again; seconds per forward
    (and, for spectrace, the hooks' accounting)."""
    cuda = ids.is_cuda
    floor = Floor()
    ends: dict[str, tuple[Action, Callable[[], None]]] = {
        "empty": (floor.empty, floor.drop),
        "note": (floor.note, floor.drop),
        "note_text": (floor.note, floor.text),
        "stats_text": (floor.keep, floor.stats_text),
    }

    def forward() -> Any:
        return model(ids)

    def floor_variant(name: str, clock: HookClock | None = None) -> float:
        """Seconds per forward; with ``clock``, the seconds inside the hooks and the step's
        end per forward instead (the floor's own accounting, as spectrace's)."""
        action, end = ends[name]
        if clock is not None:
            action, end = clock.timed(action), clock.timed(end)
        seen = Seen(model, modules, action)

        def step() -> Any:
            out = model(ids)
            end()
            return out

        try:
            seconds = per_step(step, iters, cuda)
            return seconds if clock is None else clock.spent / (iters + 3)
        finally:
            seen.remove()

    out: dict[str, float] = {"bare": per_step(forward, iters, cuda)}
    variants = [*FLOORS, *TRACED]
    for name in variants[order % len(variants) :] + variants[: order % len(variants)]:
        if name in TRACED:
            with spectrace.trace(model, stats=name.split("_")[1]) as t:
                out[name] = per_step(forward, iters, cuda)
                out[f"{name}_accounted"] = accounted_per_step(t, [model], forward, iters)
        else:
            out[name] = floor_variant(name)
            out[f"{name}_accounted"] = floor_variant(name, HookClock())
    out["bare_again"] = per_step(forward, iters, cuda)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--json", help="write the figures to this file as JSON")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = tiny_llama(num_layers=8, hidden_size=64, intermediate_size=128).to(args.device)
    ids = torch.randint(0, 128, (1, 16), device=args.device)
    modules = hooked_modules(model)
    with torch.no_grad():
        rounds = [one(model, ids, modules, args.iters, r) for r in range(args.repeats)]
    hooked = len(modules)
    result: dict[str, Any] = {
        "command": "python " + " ".join([os.path.relpath(__file__, os.getcwd()), *(a if a != args.json else "FILE" for a in sys.argv[1:])]),
        "machine": machine(),
        "device": args.device,
        "hooked_modules": hooked,
        "repeats": args.repeats,
        "bare_forward_ms": round(statistics.median(r["bare"] for r in rounds) * 1e3, 3),
        "us_per_hooked_call": {},
    }
    print(f"hooked modules {hooked}; bare forward {result['bare_forward_ms']:.3f} ms (median of {args.repeats})")
    for name in ("bare_again", *FLOORS, *TRACED):
        per_call = [(r[name] - r["bare"]) / hooked * 1e6 for r in rounds]
        low, high = quartiles(per_call)
        entry = {"median": round(statistics.median(per_call), 1), "iqr": [round(low, 1), round(high, 1)]}
        line = f"{name:16s}: {entry['median']:6.1f} us a hooked call (IQR {low:.1f}-{high:.1f})"
        if name != "bare_again":
            accounted = [r[f"{name}_accounted"] / hooked * 1e6 for r in rounds]
            entry["accounting"] = round(statistics.median(accounted), 1)
            line += f"; accounting {entry['accounting']:.1f} us"
        result["us_per_hooked_call"][name] = entry
        print(line)
    figures = result["us_per_hooked_call"]
    # (by accounting too: on a GPU machine's host the wall figures of so small a model are noise)
    over: dict[str, float] = {}
    for key in ("median", "accounting"):
        for label, traced, floor in (("shapes_only", "spectrace_off", "note_text"), ("statistics", "spectrace_basic", "stats_text")):
            over[label if key == "median" else f"{label}_accounting"] = round(figures[traced][key] / max(figures[floor][key], 1e-9), 2)
    result["spectrace_over_floor"] = over
    print(
        f"spectrace over the floor: shapes only {over['shapes_only']}x note_text (accounting {over['shapes_only_accounting']}x), "
        f"statistics {over['statistics']}x stats_text (accounting {over['statistics_accounting']}x)"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
