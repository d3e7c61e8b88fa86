"""The capture engine on real tiny Hugging Face models: records, statistics, sinks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import spectrace
from spectrace.hooks import callwrap
from spectrace.records import RECORD_ADAPTER, Call, Counters, Header
from spectrace.settings import Settings
from tests.helpers import paths
from tests.helpers.models import tiny_deepseek_v3, tiny_llama
from tests.helpers.otlp_receiver import OtlpReceiver, attributes

pytestmark = pytest.mark.usefixtures("no_spectrace_env")


def _load_jsonl(path: str) -> list:
    with open(path, encoding="utf-8") as handle:
        return [RECORD_ADAPTER.validate_json(line) for line in handle if line.strip()]


@pytest.mark.parametrize("build", [tiny_llama, tiny_deepseek_v3], ids=["llama", "deepseek_v3"])
def test_default_profile_records_every_layer_with_shapes_and_dtypes(build):
    model = build()
    ids = torch.randint(0, 128, (2, 7))
    with torch.no_grad(), spectrace.trace(model) as t:
        model(ids)
    layers = model.config.num_hidden_layers
    expected = ["model.embed_tokens", *[f"model.layers.{i}" for i in range(layers)], "model.norm", "lm_head"]
    assert t.modules() == expected
    by_name = {c.module: c for c in t.calls()}
    assert by_name["model.embed_tokens"].inputs[0].shape == [2, 7]
    assert by_name["model.embed_tokens"].inputs[0].dtype == "int64"
    for i in range(layers):
        out = by_name[f"model.layers.{i}"].outputs[0]
        assert out.shape == [2, 7, 64] and out.dtype == "float32" and out.device == "cpu"
    assert by_name["lm_head"].outputs[0].shape == [2, 7, 128]
    assert [c.step for c in t.calls()] == [0] * len(expected)
    assert [c.seq for c in t.calls()] == sorted(c.seq for c in t.calls())


def test_statistics_match_float64_reference(llama):
    ids = torch.randint(0, 128, (1, 9))
    seen = {}
    handles = [
        llama.model.layers[2].register_forward_hook(lambda m, a, o: seen.__setitem__("layer2", o.detach().clone())),
        llama.lm_head.register_forward_hook(lambda m, a, o: seen.__setitem__("lm_head", o.detach().clone())),
    ]
    with torch.no_grad(), spectrace.trace(llama, modules=["model.layers.*", "lm_head"]) as t:
        llama(ids)
    for h in handles:
        h.remove()
    for module, key in (("model.layers.2", "layer2"), ("lm_head", "lm_head")):
        ref = seen[key].double()
        stats = t.calls(module)[0].outputs[0].stats
        assert stats.mean == pytest.approx(ref.mean().item(), abs=1e-5)
        assert stats.std == pytest.approx(ref.std(unbiased=False).item(), rel=1e-4)
        assert stats.absmax == pytest.approx(ref.abs().max().item(), rel=1e-6)
        assert stats.nan == 0 and stats.inf == 0 and stats.numel == ref.numel()


def test_nan_and_inf_are_counted():
    layer = torch.nn.Linear(4, 4)
    x = torch.ones(3, 4)
    x[0, 0] = float("nan")
    x[1, 1] = float("inf")
    x[2, 2] = float("-inf")
    with spectrace.trace(torch.nn.Sequential(layer), modules="*") as t:
        t.tracer.wrap_forward(layer)
        layer(x)
    stats = t.calls("0")[0].inputs[0].stats
    assert (stats.nan, stats.inf) == (1, 2)
    assert stats.mean is None  # a NaN mean is dropped; the counts say it


@pytest.mark.parametrize("build", [tiny_llama, tiny_deepseek_v3], ids=["llama", "deepseek_v3"])
def test_outputs_bit_identical_with_and_without_tracing(build):
    model = build()
    ids = torch.randint(0, 128, (2, 11))
    with torch.no_grad():
        bare = model(ids).logits
        with spectrace.trace(model, profile="all", stats="full"):
            traced = model(ids).logits
        after = model(ids).logits
    assert torch.equal(bare, traced) and torch.equal(bare, after)


def test_hooks_and_forward_wrapper_removed_on_exit(llama):
    hooks_before = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in llama.modules())
    classes = {type(m) for m in llama.modules()}

    def users(c: type) -> int:  # traced instances of a class whose forward is wrapped
        return callwrap._class_patches.get(c, [None, None, None, 0])[3]

    users_before = {c: users(c) for c in classes}
    cls = type(llama)
    original = cls.__dict__["forward"]
    with spectrace.trace(llama):
        assert "forward" not in llama.__dict__  # nothing on the instance (copies stay clean)
        assert cls.__dict__["forward"] is not original and cls.forward.__wrapped__ is original
    assert "forward" not in llama.__dict__ and cls.__dict__["forward"] is original
    assert sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in llama.modules()) == hooks_before
    # The traced modules' classes have their own forward back, and nothing is registered.
    assert all(callwrap.hooks_of(m) is None for m in llama.modules())
    assert {c: users(c) for c in classes} == users_before  # (other live traces may hold a class too)


def test_hooks_removed_when_the_model_raises(llama):
    with pytest.raises(IndexError):
        with spectrace.trace(llama):
            llama(torch.tensor([[500]]))  # id past the vocabulary
    assert "forward" not in llama.__dict__
    assert not llama.lm_head._forward_hooks


def test_direct_forward_calls_are_steps(llama):
    """SGLang calls root.forward() directly; each call is still a step."""
    ids = torch.randint(0, 128, (1, 5))
    with torch.no_grad(), spectrace.trace(llama, modules=["lm_head"]) as t:
        llama.forward(ids)
        llama.forward(ids)
        llama(ids)
    assert [c.step for c in t.calls("lm_head")] == [0, 1, 2]


def test_selection_by_glob_type_and_profile(llama):
    with spectrace.trace(llama, modules="model.layers.*.self_attn") as t:
        pass
    assert t.hooked == [f"model.layers.{i}.self_attn" for i in range(4)]
    with spectrace.trace(llama, types=["LlamaRMSNorm"]) as t:
        pass
    assert "model.norm" in t.hooked and "model.layers.0.input_layernorm" in t.hooked and "lm_head" not in t.hooked
    with spectrace.trace(llama, modules=lambda name, m: name.endswith("mlp")) as t:
        pass
    assert t.hooked == [f"model.layers.{i}.mlp" for i in range(4)]
    with pytest.raises(ValueError, match="unknown profile"):
        spectrace.trace(llama, profile="nope")


def test_kwargs_tuples_and_model_outputs_are_walked(llama):
    with torch.no_grad(), spectrace.trace(llama, modules=["model.layers.0", "model"]) as t:
        llama(input_ids=torch.randint(0, 128, (1, 4)))
    layer = t.calls("model.layers.0")[0]
    assert any(m.arg.startswith("kwarg.position_embeddings") for m in layer.inputs)
    backbone = t.calls("model")[0]
    assert backbone.outputs[0].arg == "output.last_hidden_state"


def test_trace_file_written_to_spectrace_dir(llama, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECTRACE_DIR", str(tmp_path / "traces"))
    with torch.no_grad(), spectrace.trace(llama) as t:
        llama(torch.randint(0, 128, (1, 4)))
    assert t.path and os.path.basename(t.path).startswith("trace-") and t.path.endswith(f"-{os.getpid()}.jsonl")
    assert oct(os.stat(tmp_path / "traces").st_mode & 0o777) == "0o700"
    assert oct(os.stat(t.path).st_mode & 0o777) == "0o600"
    records = _load_jsonl(t.path)
    assert isinstance(records[0], Header) and records[0].pid == os.getpid()
    calls = [r for r in records if isinstance(r, Call)]
    assert len(calls) == len(t.calls()) == 7
    assert isinstance(records[-1], Counters) and records[-1].records_dropped == 0
    raw = json.loads(open(t.path).readlines()[1])
    assert raw["inputs"][0]["shape"] == [1, 4]  # shapes are JSON lists of integers


def test_memory_only_without_spectrace_dir(llama, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with torch.no_grad(), spectrace.trace(llama) as t:
        llama(torch.randint(0, 128, (1, 4)))
    assert t.path is None and len(t.calls()) == 7 and not list(tmp_path.iterdir())


def test_record_cap_drops_are_counted(llama, tmp_path):
    settings = Settings(record_cap=5)
    with torch.no_grad(), spectrace.trace(llama, settings=settings) as t:
        for _ in range(3):
            llama(torch.randint(0, 128, (1, 4)))
    assert len(t.calls()) == 5
    assert t.recorder.counters.records_dropped == 3 * 7 - 5


def test_stats_off_records_shapes_only(llama):
    with torch.no_grad(), spectrace.trace(llama, stats="off") as t:
        llama(torch.randint(0, 128, (1, 4)))
    assert all(m.stats is None for c in t.calls() for m in c.outputs)


def test_shapes_only_reads_inputs_after_the_call_and_records_what_statistics_mode_does(llama):
    """Shapes only puts one hook on a module (the inputs are read once the call is done);
    every call still has the same inputs and outputs, names, shapes and dtypes, as with the
    statistics mode's hook before the call."""

    def metadata(stats: str) -> list:
        with torch.no_grad(), spectrace.trace(llama, stats=stats) as t:
            llama(torch.randint(0, 128, (2, 5), generator=torch.Generator().manual_seed(0)))
            hooks = sum(len(m._forward_pre_hooks) + bool((callwrap.hooks_of(m) or (None,))[0]) for m in llama.modules())
            calls = [
                (c.module, [(m.arg, m.shape, m.dtype) for m in c.inputs], [(m.arg, m.shape, m.dtype) for m in c.outputs]) for c in t.calls()
            ]
        return calls, hooks

    shapes, pre_hooks_off = metadata("off")
    stats, pre_hooks_basic = metadata("basic")
    assert shapes == stats and any(inputs for _, inputs, _ in shapes)
    assert pre_hooks_off == 0 and pre_hooks_basic > 0


def test_internal_error_is_counted_not_raised(llama, capsys):
    with torch.no_grad(), spectrace.trace(llama) as t:
        t.recorder.emit_step = None  # a broken sink path inside spectrace
        out = llama(torch.randint(0, 128, (1, 4))).logits
    assert out.shape == (1, 4, 128)
    assert t.recorder.counters.internal_errors >= 1
    assert capsys.readouterr().err.count("internal error") == 1


@pytest.mark.parametrize(
    "name,value,field,fallback",
    [
        ("SPECTRACE_STATS", "loud", "stats", "basic"),
        ("SPECTRACE_SAMPLE", "-3", "sample", 1),
        ("SPECTRACE_RECORD_CAP", "lots", "record_cap", 100_000),
        ("SPECTRACE", "maybe", "enabled", False),
    ],
)
def test_bad_env_value_warns_once_and_falls_back(name, value, field, fallback, capsys):
    settings = Settings.from_env({name: value})
    assert getattr(settings, field) == fallback
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and name in err[0] and repr(fallback) in err[0] or str(int(fallback)) in err[0]


def test_sampling_traces_every_nth_step(llama):
    with torch.no_grad(), spectrace.trace(llama, modules="lm_head", settings=Settings(sample=2)) as t:
        for _ in range(5):
            llama(torch.randint(0, 128, (1, 3)))
    assert [c.step for c in t.calls()] == [0, 2, 4]


def test_a_sampled_step_records_what_every_step_records_and_keeps_its_calls_for_one_read(monkeypatch):
    """With sampling, a sampled step's calls are kept for one read (not noted one by one at
    their hooks) and give the records a trace of every step gives for that step; the calls
    of the other steps run the forward alone and are counted."""
    from spectrace.hooks import engine
    from spectrace.hooks.engine import Tracer

    # (an engine's module imported by an earlier test would turn keeping off: outside one here)
    monkeypatch.setattr(engine, "_engine_loaded", lambda: False)
    model = tiny_llama(layers=3)
    inputs = [torch.randint(0, 128, (2, 5), generator=torch.Generator().manual_seed(i)) for i in range(7)]
    passes: list[int] = []
    real = Tracer._read_kept

    def counting(self, state, pending, first):
        passes.append(len(pending))
        return real(self, state, pending, first)

    def run(sample: int) -> tuple[list, int]:
        with torch.no_grad(), spectrace.trace(model, settings=Settings(sample=sample)) as t:
            for ids in inputs:
                model(ids)
        return t.calls(), t.recorder.counters.calls_seen

    every, seen_every = run(1)
    monkeypatch.setattr(Tracer, "_read_kept", counting)
    sampled, seen_sampled = run(3)
    assert sorted({c.step for c in sampled}) == [0, 3, 6]
    assert max(passes) >= 3  # the decoder layers' calls of a sampled step, read together
    want = [c for c in every if c.step in (0, 3, 6)]
    assert len(sampled) == len(want) > 0
    for got, expected in zip(sampled, want):
        assert (got.step, got.module, got.role) == (expected.step, expected.module, expected.role)
        for side in ("inputs", "outputs"):
            g, e = getattr(got, side), getattr(expected, side)
            assert [(m.arg, m.shape, m.dtype) for m in g] == [(m.arg, m.shape, m.dtype) for m in e]
            for m, n in zip(g, e):  # (taken with other tensors of the pass: equal to float32 rounding)
                assert (m.stats is None) == (n.stats is None)
                if m.stats is not None:
                    assert m.stats.model_dump() == pytest.approx(n.stats.model_dump(), rel=1e-6)
    assert seen_sampled == seen_every  # every call counted, sampled or not


def test_otlp_receiver_gets_the_spans(llama, monkeypatch):
    with OtlpReceiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        with torch.no_grad(), spectrace.trace(llama) as t:
            llama(torch.randint(0, 128, (1, 6)))
        deadline = time.time() + 10
        want = len(t.calls()) + 1  # one span per module call, and their step
        while time.time() < deadline and sum(s.name == "spectrace.step" or s.name.startswith("module ") for s in receiver.spans) < want:
            time.sleep(0.05)
    names = [s.name for s in receiver.spans]
    assert "spectrace.step" in names
    module_spans = {attributes(s)["spectrace.module"]: s for s in receiver.spans if s.name.startswith("module ")}
    assert set(module_spans) == {c.module for c in t.calls()}
    lm = attributes(module_spans["lm_head"])
    assert lm["spectrace.output.shapes"] == ["[1, 6, 128]"]
    assert json.loads(lm["spectrace.record"]) == json.loads(t.calls("lm_head")[0].model_dump_json())
    step = next(s for s in receiver.spans if s.name == "spectrace.step")
    assert all(s.parent_span_id == step.span_id for s in module_spans.values())


CHILD_SCRIPT = textwrap.dedent(
    """
    import multiprocessing as mp, sys, torch
    def run():
        from transformers import LlamaConfig, LlamaForCausalLM
        cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=2)
        model = LlamaForCausalLM(cfg).eval()
        with torch.no_grad():
            model(torch.randint(0, 64, (1, 5)))
    if __name__ == "__main__":
        run()
        p = mp.get_context("spawn").Process(target=run)
        p.start(); p.join()
        sys.exit(p.exitcode)
    """
)


@pytest.mark.slow
def test_spectrace_1_traces_spawn_children_with_no_code_change(tmp_path):
    script = tmp_path / "server.py"
    script.write_text(CHILD_SCRIPT)
    env = {**os.environ, "SPECTRACE": "1", "SPECTRACE_DIR": str(tmp_path / "traces")}
    result = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    files = sorted((tmp_path / "traces").glob("trace-*.jsonl"))
    assert len(files) == 2, (files, result.stderr)
    pids = set()
    for path in files:
        records = _load_jsonl(str(path))
        pids.add(records[0].pid)
        modules = [r.module for r in records if isinstance(r, Call)]
        assert modules == [
            "LlamaForCausalLM.model.embed_tokens",
            "LlamaForCausalLM.model.layers.0",
            "LlamaForCausalLM.model.layers.1",
            "LlamaForCausalLM.model.norm",
            "LlamaForCausalLM.lm_head",
        ]
    assert len(pids) == 2
    assert result.stderr.count("spectrace: tracing on") == 1


def test_bootstrap_does_nothing_when_spectrace_unset(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECTRACE")}
    code = (
        "import site, sys; print(any(p.endswith('spectrace-bootstrap.pth') for d in site.getsitepackages() "
        "for p in __import__('os').listdir(d)), 'spectrace' in sys.modules, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    # The .pth is installed and ran, yet imported nothing.
    assert out.stdout.split() == ["True", "False", "False"], out.stderr


KILL_SCRIPT = textwrap.dedent(
    """
    import sys, torch, spectrace
    from spectrace.settings import Settings
    sys.path.insert(0, {root!r})
    from tests.helpers.models import tiny_llama
    model = tiny_llama(layers=2)
    with torch.no_grad(), spectrace.trace(model, directory={dir!r}, settings=Settings(flush_seconds=0.001)):
        print("running", flush=True)
        while True:
            model(torch.randint(0, 128, (1, 16)))
    """
)


@pytest.mark.slow
def test_sigkill_leaves_a_loadable_file(tmp_path):
    script = tmp_path / "victim.py"
    script.write_text(KILL_SCRIPT.format(root=str(paths.ROOT), dir=str(tmp_path / "t")))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "running"
    deadline = time.time() + 60
    while time.time() < deadline:  # let it write a while, however loaded the machine is
        files = list((tmp_path / "t").glob("*.jsonl"))
        if files and files[0].read_bytes().count(b"\n") > 40:
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    (path,) = list((tmp_path / "t").glob("*.jsonl"))
    lines = path.read_bytes().split(b"\n")
    complete = lines[:-1]  # the last piece may be a torn line; every complete line must load
    assert len(complete) > 20
    for line in complete:
        RECORD_ADAPTER.validate_json(line)


@pytest.mark.slow
def test_sigterm_flushes_before_dying(tmp_path):
    script = tmp_path / "server.py"
    script.write_text(
        "import torch, time, sys\n"
        f"sys.path.insert(0, {str(paths.ROOT)!r})\n"
        "from tests.helpers.models import tiny_llama\n"
        "m = tiny_llama(layers=2)\n"
        "with torch.no_grad(): m(torch.randint(0, 128, (1, 4)))\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    env = {**os.environ, "SPECTRACE": "1", "SPECTRACE_DIR": str(tmp_path / "t"), "SPECTRACE_FLUSH_SECONDS": "3600"}
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, env=env, text=True)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM
    (path,) = list((tmp_path / "t").glob("*.jsonl"))
    records = _load_jsonl(str(path))
    assert sum(isinstance(r, Call) for r in records) == 5 and isinstance(records[-1], Counters)


def test_nested_tensor_call_is_recorded_not_lost():
    class Identity(torch.nn.Module):
        def forward(self, x):
            return x

    model = torch.nn.Sequential(Identity())
    nested = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)], layout=torch.jagged)
    with spectrace.trace(model, modules="*") as t:
        model(torch.randn(2, 3))
        model(nested)
    assert [c.inputs[0].shape for c in t.calls("0")] == [[2, 3], []]
    assert t.recorder.counters.internal_errors == 0


def test_traces_closed_out_of_order_leave_a_clean_model(llama):
    ids = torch.randint(0, 128, (1, 4))
    outer = spectrace.trace(llama, modules="lm_head")
    inner = spectrace.trace(llama, modules="model.norm")
    with torch.no_grad():
        llama(ids)
        outer.close()  # closed first although opened first: inner still traces
        llama(ids)
        inner.close()
        llama(ids)
    assert len(outer.calls("lm_head")) == 1
    assert len(inner.calls("model.norm")) == 2
    # What is left is at most a pass-through; no hook and no trace sees the third forward.
    assert not llama.lm_head._forward_hooks and not llama.model.norm._forward_hooks
    with torch.no_grad(), spectrace.trace(llama, modules="lm_head") as again:
        llama(ids)
    assert len(again.calls("lm_head")) == 1


def test_call_records_built_off_thread_validate_like_the_schema():
    """The worker builds records without validation; each must equal the validated one."""
    from spectrace.records import Call

    model = tiny_llama()
    with torch.no_grad(), spectrace.trace(model, stats="full") as t:
        model(torch.randint(0, 128, (2, 7)))
    calls = t.calls()
    assert calls and any(m.stats is not None for c in calls for m in c.inputs + c.outputs)
    for call in calls:
        again = Call.model_validate_json(call.model_dump_json())
        assert again == Call(**call.model_dump())
        assert again.model_dump() == call.model_dump()


def test_records_built_on_the_worker_thread_equal_those_built_inline():
    """The GPU path hands steps to the record worker; on the CPU it is forced here."""
    import threading

    from spectrace.hooks import engine

    model = tiny_llama()
    ids = torch.randint(0, 128, (2, 7))
    threads: list[str] = []
    original = engine.Tracer._build_step

    def spy(self, item, **kwargs):
        threads.append(threading.current_thread().name)
        return original(self, item, **kwargs)

    results = {}
    for offload in ("auto", "always"):
        engine.Tracer._build_step = spy
        try:
            with torch.no_grad(), spectrace.trace(model, stats="full") as t:
                t.tracer.offload = offload
                for _ in range(3):
                    model(ids)
            results[offload] = [c.model_dump(exclude={"t_unix"}) for c in t.calls()]
        finally:
            engine.Tracer._build_step = original
    assert threads[:3] == ["MainThread"] * 3 and set(threads[3:]) == {"spectrace-records"}
    assert len(results["auto"]) == len(results["always"]) > 0
    strip = lambda calls: [{k: v for k, v in c.items() if k != "seq"} for c in calls]  # noqa: E731
    assert strip(results["auto"]) == strip(results["always"])


@pytest.fixture
def build_threads(monkeypatch):
    """The name of the thread that builds each step's records (Tracer._build_step), in order."""
    import threading

    from spectrace.hooks import engine

    original = engine.Tracer._build_step
    threads: list[str] = []

    def spy(self, item, **kwargs):
        threads.append(threading.current_thread().name)
        return original(self, item, **kwargs)

    monkeypatch.setattr(engine.Tracer, "_build_step", spy)
    return threads


def test_a_device_step_whose_statistics_landed_is_built_by_the_host_not_the_worker(monkeypatch, build_threads):
    """A host that runs ahead of its device builds its landed steps itself at its step's end
    (RecordWorker.build_landed_here): the worker would build them while the host runs, and
    the two would take turns at the GIL. The meta device stands in for an accelerator
    here: its steps are device steps whose statistics need no read-back."""
    from spectrace.hooks import engine

    model = tiny_llama().to("meta")
    ids = torch.randint(0, 128, (2, 7), device="meta")
    threads = build_threads
    results = {}
    for case in ("auto", "always", "serving"):
        threads.clear()
        with monkeypatch.context() as m:
            # Under an engine (a test before this one may have imported SGLang here): the
            # worker, as measured live; otherwise the host.
            m.setattr(engine, "_engine_loaded", lambda serving=(case == "serving"): serving)
            with torch.no_grad(), spectrace.trace(model, stats="basic") as t:
                t.tracer.offload = "always" if case == "always" else "auto"
                for _ in range(3):
                    model(ids)
                queued = t.tracer._worker.pending
            results[case] = [c.model_dump(exclude={"t_unix", "seq"}) for c in t.calls()]
        if case == "auto":
            assert queued == 0 and threads == ["MainThread"] * 3
        else:
            assert threads and set(threads) == {"spectrace-records"}, (case, threads)
    assert results["auto"] and results["auto"][0]["outputs"][0]["device"] == "meta"
    assert results["auto"] == results["always"] == results["serving"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a step whose statistics land later is a CUDA step")
def test_a_cuda_step_is_built_by_the_host_once_its_statistics_landed_with_the_workers_statistics(monkeypatch, build_threads):
    """Outside a serving engine, each CUDA step's records are built by the host at a later
    step's end, once its statistics are on the host (never waiting for them); the worker
    builds what is left at the flush. The statistics are the worker's, exactly."""
    from spectrace.hooks import engine

    model = tiny_llama(layers=3, hidden=64).to("cuda")
    ids = torch.randint(0, 128, (2, 8), device="cuda")
    threads = build_threads
    monkeypatch.setattr(engine, "_engine_loaded", lambda: False)
    runs = {}
    for offload in ("auto", "always"):
        threads.clear()
        with torch.no_grad(), spectrace.trace(model, stats="basic") as t:
            t.tracer.offload = offload
            for _ in range(4):
                model(ids)
                torch.cuda.synchronize()  # the step's statistics land before the next one ends
            runs[offload] = [(c.step, c.module, [m.stats for m in (*c.inputs, *c.outputs)]) for c in t.calls()]
        if offload == "auto":
            assert threads[:3] == ["MainThread"] * 3, threads  # steps 1-3, each at the next step's end
        else:
            assert set(threads) == {"spectrace-records"}, threads
    assert runs["auto"] == runs["always"] and any(s is not None for _, _, stats in runs["auto"] for s in stats)


def test_call_json_of_both_encoders_matches_the_schema():
    """The worker's JSON (pydantic-core's encoder, or the standard library's on an older
    pydantic-core) parses into the same Call as the pydantic model writes."""
    from spectrace.hooks import call_text
    from spectrace.records import Call

    fields = {
        "type": "call",
        "step": 2,
        "seq": 9,
        "module": "model.layers.NaN",
        "module_type": "LlamaDecoderLayer",
        "root": "r",
        "inputs": [
            {
                "arg": "input[0]",
                "shape": [1, 4],
                "dtype": "bfloat16",
                "device": "cuda:0",
                "stats": {"mean": 0.5, "std": None, "absmax": 2.0, "nan": 0, "inf": 1, "numel": 4},
            }
        ],
        "outputs": [],
        "t_unix": 1.5,
        "graph_capture": False,
    }
    reference = Call.model_validate(fields)
    for dumps in (call_text.dumps_core, call_text.dumps_json):
        assert Call.model_validate_json(dumps(fields)) == reference
    assert "NaN" in call_text.dumps_core(fields)  # names keep their text; only floats become null
