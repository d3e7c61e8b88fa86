"""`spectrace view` of a plain Hugging Face model: no EAGLE-3 pair, so no data path.

The tiny Llama of conftest runs in a child process under ``SPECTRACE=1`` (the .pth
bootstrap of the installed package attaches the hooks, as a user gets it); the view is
the real CLI's output at 80 and 120 columns. A plain model's ``model.layers.0`` is no
draft's decoder layer, and an fc it never had was not bypassed: the screen is a table of
its modules, with non-finite values flagged on the module that produced them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from spectrace.viewers.loader import load_traces
from spectrace.viewers.model import build_view
from tests.helpers import paths

ROOT = paths.ROOT

SCRIPT = textwrap.dedent(
    """
    import sys, torch
    sys.path.insert(0, {root!r})
    from tests.helpers.models import tiny_llama
    torch.manual_seed(0)
    model = tiny_llama().eval()
    if "nan" in sys.argv:
        with torch.no_grad():
            model.model.layers[1].mlp.down_proj.weight[0, 0] = float("nan")
    with torch.no_grad():
        for n in (5, 6):
            model(torch.randint(0, 128, (1, n)))
    """
)


def _traced(tmp_path: Path, *args: str) -> Path:
    script = tmp_path / "plain.py"
    script.write_text(SCRIPT.format(root=str(ROOT)))
    out = tmp_path / "traces"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECTRACE")}
    env.update(SPECTRACE="1", SPECTRACE_DIR=str(out))
    done = subprocess.run([sys.executable, str(script), *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert list(out.glob("trace-*.jsonl")), done.stderr
    return out


def _view(path: Path, columns: int, *flags: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECTRACE")}
    env.update(COLUMNS=str(columns), NO_COLOR="1")
    done = subprocess.run(
        [sys.executable, "-m", "spectrace", "view", str(path), "--no-pager", *flags],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _without_roles(src: Path, dst: Path) -> Path:
    """The same trace as an older writer left it: calls name no role."""
    dst.mkdir()
    for path in src.glob("trace-*.jsonl"):
        lines = []
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            rec.pop("role", None)
            lines.append(json.dumps(rec))
        (dst / path.name).write_text("\n".join(lines) + "\n")
    return dst


@pytest.fixture(scope="module")
def plain_trace(tmp_path_factory) -> Path:
    return _traced(tmp_path_factory.mktemp("plain"))


def _assert_plain_screen(text: str) -> None:
    assert "fc BYPASSED" not in text and "BYPASSED" not in text
    assert "decoder layer" not in text
    assert "EAGLE-3 data path" not in text and "target capture" not in text and "d2t" not in text
    assert "Modules of LlamaForCausalLM: no EAGLE-3 draft traced" in text
    for name in ("model.embed_tokens", "model.norm", "lm_head"):
        assert name in text, name
    # Repeated layers are one row by default; a layer with something wrong keeps its own.
    assert "model.layers.[0-3]" in text or ("model.layers.0" in text and "model.layers.3" in text)


@pytest.mark.parametrize("columns", [80, 120])
def test_plain_llama_gets_a_module_table_not_a_data_path(plain_trace, columns):
    text = _view(plain_trace, columns)
    _assert_plain_screen(text)
    assert "Findings: none" in text
    assert max(len(line) for line in text.splitlines()) <= columns
    # The four decoder layers folded into one row: their calls summed, one output pattern.
    folded = [line for line in text.splitlines() if "model.layers.[0-3]" in line]
    assert len(folded) == 1 and " 8 " in folded[0] and "[1,5..6,64]" in folded[0]
    assert "--all-layers" in text
    text = _view(plain_trace, columns, "--all-layers")
    assert max(len(line) for line in text.splitlines()) <= columns
    rows = [line for line in text.splitlines() if "model.layers.0" in line]
    assert len(rows) == 1
    # calls, output shape over both forwards, dtype: one row
    assert " 2 " in rows[0] and "[1,5..6,64]" in rows[0] and "f32" in rows[0]
    if columns >= 100:  # the type has its own column ...
        assert "LlamaDecoderLayer" in rows[0]
    else:  # ... or the line under the name
        lines = text.splitlines()
        assert lines[lines.index(rows[0]) + 1].strip() == "LlamaDecoderLayer"
    head = next(line for line in text.splitlines() if "calls" in line and "absmax" in line)
    assert all(word in head for word in ("module", "type", "calls", "out", "dt", "mean", "std", "absmax", "!"))


def test_plain_llama_without_roles_is_no_bypass(plain_trace, tmp_path):
    # An older trace tells stages by names: layers.0, norm, lm_head match a draft's, and the
    # missing fc read as "fc BYPASSED" beside "Findings: none".
    legacy = _without_roles(plain_trace, tmp_path / "legacy")
    view = build_view(load_traces(str(legacy)))
    assert not view.datapath.eagle3
    assert view.datapath.fc.status == "not seen" and view.datapath.layer.calls == 0
    _assert_plain_screen(_view(legacy, 80))


@pytest.mark.slow
def test_nonfinite_values_are_flagged_on_their_module(tmp_path):
    traced = _traced(tmp_path, "nan")
    text = _view(traced, 120)
    _assert_plain_screen(text)
    rows = {line.split()[0]: line for line in text.splitlines() if line.startswith(" model.") or line.startswith(" lm_head")}
    assert "nan x" not in rows["model.layers.0"] and "nan x" not in rows["model.embed_tokens"]
    for name in ("model.layers.1", "model.layers.2", "model.norm", "lm_head"):
        assert "nan x" in rows[name], rows[name]


def test_eagle3_pair_still_draws_its_data_path(tmp_path, demo_cache):
    demo_cache.run("fc_bypass", tmp_path)
    view = build_view(load_traces(str(tmp_path / "fc_bypass")))
    assert view.datapath.eagle3 and view.datapath.fc.status == "bypassed"
    text = _view(tmp_path / "fc_bypass", 80)
    assert "EAGLE-3 data path" in text and "decoder layer" in text and "BYPASSED" in text
    assert "no EAGLE-3 draft traced" not in text


def test_nonfinite_finding_flags_a_module_whose_outputs_look_clean(tmp_path):
    # NaN in an input only (the output was masked): the row's own statistics show nothing,
    # the nonfinite finding from checks/ names the module, and the table shows that.
    from spectrace.checks.calls import check_nonfinite
    from spectrace.records import Call, TensorMeta, TensorStats
    from tests.helpers.traces import header, write_trace

    def meta(arg: str, nan: int) -> TensorMeta:
        stats = TensorStats(mean=None if nan else 0.0, std=None if nan else 1.0, absmax=3.0, numel=256, nan=nan)
        return TensorMeta(arg=arg, shape=[4, 64], dtype="torch.float32", device="cpu", stats=stats)

    calls = [
        Call(step=0, seq=0, module="M.model.norm", module_type="RMSNorm", inputs=[meta("input[0]", 0)], outputs=[meta("output", 0)]),
        Call(step=0, seq=1, module="M.lm_head", module_type="Linear", inputs=[meta("input[0]", 2)], outputs=[meta("output", 0)]),
    ]
    found = check_nonfinite(calls)
    assert [f.module for f in found] == ["M.lm_head"]
    write_trace(tmp_path / "trace-plain.jsonl", [header(), *calls, *found])
    view = build_view(load_traces(str(tmp_path)))
    assert not view.datapath.eagle3
    rows = {r.module: r for r in view.modules}
    assert rows["M.lm_head"].anomalies == ["non-finite"] and rows["M.model.norm"].anomalies == []
    text = _view(tmp_path, 80)
    assert "nonfinite" in text
    (row,) = [line for line in text.splitlines() if line.startswith(" lm_head")]
    assert row.rstrip().endswith("non-finite")
