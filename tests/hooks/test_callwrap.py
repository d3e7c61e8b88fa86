"""Module calls seen through the class's forward (callwrap) instead of torch's hooks:
each call recorded once, whatever else wraps the class, and nothing left behind."""

from __future__ import annotations

import copy

import torch

import spectrace
from spectrace.hooks import callwrap, stepwrap
from tests.helpers.models import tiny_llama


class Scaled(torch.nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * 2


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.plain = torch.nn.Linear(4, 4)
        self.scaled = Scaled(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scaled(self.plain(x))


def test_layers_are_traced_through_their_class_and_record_each_call_once():
    llama = tiny_llama(layers=2)
    ids = torch.randint(0, 128, (1, 5))
    with torch.no_grad(), spectrace.trace(llama, stats="basic") as t:
        assert callwrap.hooks_of(llama.model.layers[0]) is not None
        assert not llama.model.layers[0]._forward_hooks and not llama.model.layers[0]._forward_pre_hooks
        llama(ids)
        llama(ids)
    per_module = {}
    for c in t.calls():
        per_module.setdefault(c.module, []).append(c.step)
    assert per_module["model.layers.1"] == [0, 1]
    assert all(steps == [0, 1] for steps in per_module.values()), per_module
    layer = t.calls("model.layers.1")[0]
    assert layer.outputs[0].stats is not None and layer.inputs[0].shape == [1, 5, 64]


def test_a_subclass_calling_super_forward_is_one_call_of_its_own_module():
    net = Net()
    with torch.no_grad(), spectrace.trace(net, modules=["plain", "scaled"]) as t:
        net(torch.randn(2, 4))
    assert [c.module for c in t.calls()] == ["plain", "scaled"]


class Own(torch.nn.Linear):
    """A class no other test traces: its patches are this test's alone."""


def test_a_wrapper_left_inside_another_libraries_patch_does_not_fire_twice():
    # A traced module's class gets our wrapper; another wrapper goes on top; our trace
    # ends (ours stays inside theirs as a pass-through); a new trace wraps again.
    net = torch.nn.Sequential(Own(4, 4))
    x = torch.randn(2, 4)
    with spectrace.trace(net, modules=["0"]):
        ours = Own.forward
        assert getattr(ours, "__spectrace_call_wrapper__", False)

        def theirs(self, *args, **kwargs):
            return ours(self, *args, **kwargs)

        Own.forward = theirs
    assert Own.__dict__["forward"] is theirs  # ours left inside theirs
    try:
        with torch.no_grad(), spectrace.trace(net, modules=["0"]) as t:
            net(x)
        assert [c.module for c in t.calls()] == ["0"]
    finally:
        del Own.forward
    assert "forward" not in Own.__dict__ and callwrap.hooks_of(net[0]) is None


def test_a_deep_copy_of_a_traced_model_is_untraced_and_runs_its_own_weights():
    net = Net()
    x = torch.randn(2, 4)
    with torch.no_grad(), spectrace.trace(net, modules=["plain", "scaled"]) as t:
        twin = copy.deepcopy(net)
        for p in twin.parameters():
            p.zero_()
        assert torch.equal(twin(x), torch.zeros(2, 4))
        net(x)
    assert [c.module for c in t.calls()] == ["plain", "scaled"]  # the twin's calls are not in it
    assert callwrap.hooks_of(twin.plain) is None


def test_a_module_with_a_forward_of_its_own_keeps_torch_hooks():
    # Another library's instance-level wrapper (accelerate sets module.forward): our class
    # wrapper would never run under it, so that module gets torch's hooks.
    net = Net()
    original = net.plain.forward

    def their_forward(*args, **kwargs):
        return original(*args, **kwargs)

    net.plain.forward = their_forward
    with torch.no_grad(), spectrace.trace(net, modules=["plain", "scaled"]) as t:
        assert callwrap.hooks_of(net.plain) is None and net.plain._forward_hooks
        assert callwrap.hooks_of(net.scaled) is not None and not net.scaled._forward_hooks
        net(torch.randn(1, 4))
    assert [c.module for c in t.calls()] == ["plain", "scaled"]
    assert net.plain.forward is their_forward and not net.plain._forward_hooks
    assert not stepwrap._traced.get(id(net))


def test_a_class_mostly_untraced_keeps_its_forward_and_its_traced_instances_get_torch_hooks():
    # A traced lm_head must not put a wrapper on nn.Linear: every q/k/v/o/gate/up/down call
    # of the model would pay its lookup. The layers, all traced, go through their class.
    llama = tiny_llama(layers=2)
    linear_forward = torch.nn.Linear.forward
    with torch.no_grad(), spectrace.trace(llama, stats="off") as t:
        assert torch.nn.Linear.forward is linear_forward
        assert callwrap.hooks_of(llama.lm_head) is None and llama.lm_head._forward_hooks
        assert callwrap.hooks_of(llama.model.norm) is None and llama.model.norm._forward_hooks  # 1 of 5 norms
        assert callwrap.hooks_of(llama.model.layers[1]) is not None
        llama(torch.randint(0, 128, (1, 5)))
    modules = [c.module for c in t.calls()]
    assert modules.count("lm_head") == 1 and modules.count("model.norm") == 1 and modules.count("model.layers.1") == 1
