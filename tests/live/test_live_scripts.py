"""The live-server scripts (scripts/live/) on CPU: syntax, the pure helpers, and a dry run.

The dry run drives ``run_live_all.sh all`` end to end against a stand-in for
``sglang.launch_server`` (an HTTP server that spawns a "scheduler" child, as SGLang does).
It runs on the venv's *base* interpreter, where spectrace is not installed, so what it
proves is the GPU machine's set-up: the sitecustomize + ``.pth`` bootstrap and the
generated dist-info activate spectrace in the server and its spawned child, SIGTERM
flushes the traces (gracefully, or by the nudge when a scheduler hangs), and the
summary, views and tarballs land in $OUT.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tarfile
import textwrap

import pytest

from tests.helpers import paths
from tests.helpers.scripts import load_script

ROOT = str(paths.ROOT)
LIVE = os.path.join(ROOT, "scripts", "live")
SCRIPT = os.path.join(LIVE, "run_live_all.sh")

pytestmark = pytest.mark.usefixtures("no_spectrace_env")


lk = load_script(os.path.join(LIVE, "livekit.py"))


# ----------------------------------------------------------------------------- syntax


def test_shell_script_is_shellcheck_clean():
    exe = shutil.which("shellcheck")
    if exe is None:
        pytest.skip("shellcheck is not installed")
    proc = subprocess.run([exe, SCRIPT], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


# ------------------------------------------------------------------------- pure parts


def test_dist_info_carries_only_the_sglang_plugin_entry_point():
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as fh:
        name, version, groups = lk.project_metadata(fh.read())
    assert (name, version) == ("spectrace", "0.1.0")
    assert groups == {"sglang.srt.plugins": {"spectrace": "spectrace.integrations.sglang.plugin:register"}}
    files = lk.dist_info_files(name, version, groups)
    assert "Name: spectrace\nVersion: 0.1.0" in files["METADATA"]
    assert files["entry_points.txt"].startswith("[sglang.srt.plugins]\nspectrace = spectrace.integrations.sglang.plugin:register")


def test_boot_folder_activates_through_sitecustomize(tmp_path):
    """An interpreter without spectrace installed, only PYTHONPATH set: the .pth runs, the entry point is seen."""
    bare = _bare_python()
    paths = lk.make_boot(str(tmp_path / "w"), ROOT)
    code = textwrap.dedent("""
        import json, sys
        from importlib.metadata import entry_points
        eps = [(e.name, e.value) for e in entry_points(group="sglang.srt.plugins")]
        rt = sys.modules.get("spectrace.runtime")
        print(json.dumps({"eps": eps,
                          "active": bool(rt and rt.is_active())}))
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPECTRACE", "PYTHON"))}
    env["PYTHONPATH"] = os.pathsep.join([ROOT, paths["sc"]])
    for on in ("0", "1"):
        env["SPECTRACE"] = on
        env["SPECTRACE_DIR"] = str(tmp_path / "traces")
        proc = subprocess.run([bare, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        got = json.loads(proc.stdout.strip().splitlines()[-1])
        assert got["eps"] == [["spectrace", "spectrace.integrations.sglang.plugin:register"]]
        assert got["active"] is (on == "1")


def test_sitecustomize_chains_to_the_next_one(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import builtins\nbuiltins.OTHER_SITECUSTOMIZE = True\n")
    sc = tmp_path / "sc"
    sc.mkdir()
    (sc / "sitecustomize.py").write_text(lk.sitecustomize_source([str(tmp_path / "missing")]))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = os.pathsep.join([str(sc), str(other)])
    proc = subprocess.run(
        [sys.executable, "-c", "import builtins; print(getattr(builtins, 'OTHER_SITECUSTOMIZE', False))"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.stdout.strip() == "True", proc.stderr


SERVER_LOG = """\
spectrace: tracing on; traces go to /tmp/x
[2026-11-30 12:00:00] Capture draft decode CUDA graph begin. backend=full, avail mem=100 GB
Capturing batches (bs=4 avail_mem=100 GB): 100%|###|
[2026-11-30 12:00:01] Capture cuda graph end. Time elapsed: 3.0 s. mem usage=0.1 GB.
spectrace: warning: not covered: SGLang graph replay is not traced per module

==== spectrace: ERROR fc_bypass at draft.model.fc ====
  cause: the draft got 256-wide hidden states
  fix:   make the target capture
==== (written to the trace; repeats are counted, not printed) ====
[2026-11-30 12:00:05] Decode batch, #running-req: 1, accept len: 1.50, accept rate: 0.17, cuda graph: True
[2026-11-30 12:00:06] Decode batch, #running-req: 1, accept len: 1.00, accept rate: 0.00, cuda graph: True
[2026-11-30 12:00:07] Decode batch, #running-req: 32, #token: 9152, accept len: 1.00, cuda graph: True, gen throughput (token/s): 10000.00, #queue-req: 0
[2026-11-30 12:00:08] Decode batch, #running-req: 32, #token: 9312, accept len: 1.00, cuda graph: True, gen throughput (token/s): 6000.00, #queue-req: 0
[2026-11-30 12:00:09] Decode batch, #running-req: 32, #token: 9472, accept len: 1.00, cuda graph: True, gen throughput (token/s): 10400.00, #queue-req: 0
[2026-11-30 12:00:10] Decode batch, #running-req: 7, #token: 900, accept len: 1.00, cuda graph: True, gen throughput (token/s): 2000.00, #queue-req: 0
"""


def test_parse_server_log():
    got = lk.parse_server_log(SERVER_LOG)
    assert got["accept_len_lines"] == [1.5, 1.0, 1.0, 1.0, 1.0, 1.0] and got["accept_len_last"] == 1.0
    # The scheduler's own rate at the full batch (32 here); the tail batch of 7 is left out.
    assert got["gen_throughput_at_full_batch"] == {"running_req": 32, "intervals": 3, "median": 10000.0, "share_below_80pct_of_p90": 0.333}
    assert got["findings_printed"] == [{"severity": "error", "code": "fc_bypass", "where": "draft.model.fc"}]
    assert any("not covered" in ln for ln in got["spectrace_lines"])
    assert got["graph_lines"] and all("graph" in ln.lower() for ln in got["graph_lines"])
    assert len(got["sglang_graph_lines"]) == 2  # begin and end; the progress bar is not counted
    assert got["sglang_error_lines"] == []


def test_mean_accept_weights_by_verify_steps():
    reqs = [
        {"spec_accept_length": 2.0, "spec_verify_ct": 10},
        {"spec_accept_length": 1.0, "spec_verify_ct": 30},
        {"spec_accept_length": None},
    ]
    assert lk.mean_accept(reqs) == 1.25
    assert lk.mean_accept([]) is None


def test_bench_stats_ratio_and_rounds():
    runs = {
        "off": [{"round": r, "tok_s": v} for r, v in enumerate([100.0, 110.0, 90.0])],
        "on": [{"round": r, "tok_s": v} for r, v in enumerate([99.0, 107.8, 90.0])],
    }
    got = lk.bench_stats(runs)
    assert got["median_tok_s"] == {"off": 100.0, "on": 99.0}
    assert got["ratio_of_medians"] == 0.99
    assert got["round_ratios"] == [0.99, 0.98, 1.0] and got["median_round_ratio"] == 0.99


def test_bench_merge_pools_abba_servers_and_reports_the_aa_spread():
    def one(label: str, rates: list[float]) -> dict:
        return {"batch": 32, "max_new_tokens": 256, "runs": {label: [{"round": r, "tok_s": v} for r, v in enumerate(rates)]}}

    got = lk.bench_merge(
        {
            "overhead-off-1": one("off", [100.0, 102.0, 98.0]),
            "overhead-on-1": one("on", [97.0, 99.0, 98.0]),
            "overhead-on-2": one("on", [95.0, 96.0, 94.0]),
            "overhead-off-2": one("off", [96.0, 97.0, 95.0]),
        }
    )
    assert got["median_tok_s"] == {"off": 97.5, "on": 96.5} and got["ratio_of_medians"] == round(96.5 / 97.5, 4)
    assert got["pair_ratios"] == {"on-1/off-1": 0.98, "on-2/off-2": round(95 / 96, 4)}
    assert got["aa_off"] == 0.96 and got["aa_on"] == round(95 / 98, 4) and got["rounds"] == 12
    assert got["design"].endswith("overhead-off-1, overhead-on-1, overhead-on-2, overhead-off-2")
    assert got["ratio_of_server_means"] == round((98 + 95) / (100 + 96), 4)  # each server weighs once
    third = lk.bench_merge(
        {
            "overhead-on-1": one("on", [90.0]),
            "overhead-off-1": one("off", [100.0]),
            "overhead-on-2": one("on", [99.0]),
            "overhead-off-2": one("off", [100.0]),
            "overhead-on-3": one("on", [93.0]),
            "overhead-off-3": one("off", [93.0]),
        }
    )
    assert third["pair_ratios"] == {"on-1/off-1": 0.9, "on-2/off-2": 0.99, "on-3/off-3": 1.0}
    md = lk.render_markdown({"variants": {}, "overhead": got})
    assert "on/off: **0.99**" in md and "| overhead-on-2 | 3 | 95.00 |" in md


def test_prompts_stay_inside_the_tiny_vocabulary():
    ps = lk.prompts(32, 32, offset=7)
    assert len(ps) == 32 and all(len(p) == 32 for p in ps)
    assert min(min(p) for p in ps) >= 3 and max(max(p) for p in ps) < 2048
    assert len({tuple(p) for p in ps}) == 32


def test_trace_file_facts_tells_closed_from_cut(tmp_path):
    d = tmp_path / "t"
    d.mkdir()
    head = json.dumps({"type": "header", "pid": 7, "rank": 0})
    (d / "trace-a.jsonl").write_text("\n".join([head, json.dumps({"type": "acceptance"}), json.dumps({"type": "stats"})]) + "\n")
    (d / "trace-b.jsonl").write_text("\n".join([head, json.dumps({"type": "acceptance"}), "{cut"]) + "\n")
    a, b = lk.trace_dir_facts(str(d))
    assert a["closed"] is True and a["types"] == {"acceptance": 1, "header": 1, "stats": 1} and a["rank"] == 0
    assert b["closed"] is False and b["bad_lines"] == 1


# --------------------------------------------------------------------------- dry run

FAKE_LAUNCH_SERVER = r'''
"""Stand-in for sglang.launch_server: HTTP front, a spawned scheduler, SGLang-like shutdown."""
import argparse, json, multiprocessing as mp, os, signal, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.metadata import entry_points


def scheduler(conn, hang):
    rt = sys.modules.get("spectrace.runtime")
    eps = sorted(e.value for e in entry_points(group="sglang.srt.plugins"))
    print(f"fake scheduler: plugins {eps} spectrace active {bool(rt and rt.is_active())}", file=sys.stderr, flush=True)
    if rt is not None and rt.is_active():
        from spectrace.integrations.sglang.patching import guarded
        from spectrace.integrations.sglang.points import POINTS
        from spectrace.recorder import Recorder
        # runtime.recorder() builds through spectrace.api, which imports torch (on the GPU image);
        # this interpreter has none, so the stand-in hands the runtime a plain recorder.
        rec = rt._state.setdefault("recorder", Recorder(rt.settings(), directory=rt.settings().dir))
        from spectrace.records import Acceptance
        # The real graph-replay hook, as SGLang's HookRegistry calls it after each replay
        # (the acceptance hook needs torch, which this interpreter lacks).
        after_replay = guarded(next(p for p in POINTS if p.feature == "graph_replay" and p.kind == "AFTER"))

        class DecodeCudaGraphRunner:
            pass

        for step in range(12):
            after_replay(None, DecodeCudaGraphRunner())
            rec.emit(Acceptance(step=step, accept_lengths=[1], draft_tokens=3, accepted_per_position=[0, 0, 0]))
    conn.recv()  # ShutdownReq
    while hang:  # a scheduler that never exits: the driver's nudge must flush it
        time.sleep(0.2)


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def _send(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._send(200 if self.path == "/health" else 404, {})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        n = body["sampling_params"]["max_new_tokens"]
        ids = body["input_ids"]
        one = lambda: {"output_ids": [5] * n, "meta_info": {"spec_accept_length": 1.0, "spec_verify_ct": n,
                                                            "completion_tokens": n}}
        print(f"Decode batch, #running-req: 1, accept len: 1.00, accept rate: 0.00, cuda graph: True",
              file=sys.stderr, flush=True)
        self._send(200, [one() for _ in ids] if ids and isinstance(ids[0], list) else one())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int)
    p.add_argument("--speculative-algorithm")
    p.add_argument("--cuda-graph-max-bs-decode")
    a, _ = p.parse_known_args()
    if a.cuda_graph_max_bs_decode is not None and os.environ.get("FAKE_REFUSE_EXTRA"):
        print("launch_server: error: unrecognized arguments: --cuda-graph-max-bs-decode", file=sys.stderr)
        sys.exit(2)
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=scheduler, args=(child, a.speculative_algorithm == "EAGLE"))
    proc.start()
    time.sleep(0.5)
    server = ThreadingHTTPServer(("127.0.0.1", a.port), Handler)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    server.serve_forever()
    parent.send("shutdown")
    proc.join(6)
    if proc.is_alive():
        proc.kill()
    os.kill(os.getpid(), signal.SIGKILL)  # SGLang's kill_process_tree(include_parent=True)


if __name__ == "__main__":
    main()
'''

# What the fake site needs from the venv: spectrace's own imports (the GPU image has rich,
# the SGLang tarball brings pydantic).
_DEPS = (
    "pydantic",
    "pydantic_core",
    "annotated_types",
    "typing_inspection",
    "typing_extensions",
    "rich",
    "pygments",
    "markdown_it",
    "mdurl",
)


def _fake_site_tarball(tmp_path) -> str:
    site = tmp_path / "fake-site"
    (site / "sglang").mkdir(parents=True)
    (site / "sglang" / "__init__.py").write_text("")
    (site / "sglang" / "launch_server.py").write_text(FAKE_LAUNCH_SERVER)
    for name in _DEPS:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.origin:
            pytest.skip(f"{name} not importable here")
        src = os.path.dirname(spec.origin) if spec.submodule_search_locations else spec.origin
        os.symlink(src, site / os.path.basename(src))
    tar = tmp_path / "fake-site.tar.xz"
    with tarfile.open(tar, "w:xz") as tf:
        tf.add(site, arcname=".")
    return str(tar)


def _free_port_base() -> int:
    """A base whose six ports (the script uses base + 0/10/20/30/100/110) are free now."""
    for _ in range(50):
        base = random.randrange(20000, 29000, 10)
        try:
            for off in (0, 10, 20, 30, 100, 110):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", base + off))
            return base
        except OSError:
            continue
    pytest.skip("no free port range")


def _bare_python() -> str:
    base = getattr(sys, "_base_executable", sys.executable)
    probe = subprocess.run(
        [base, "-c", "import importlib.util as u; print(u.find_spec('spectrace') is None)"],
        capture_output=True,
        text=True,
        cwd=os.sep,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    if probe.stdout.strip() != "True":
        pytest.skip("no interpreter without spectrace installed (the venv's base has it)")
    return base


@pytest.mark.slow
def test_dry_run_all_phases(tmp_path):
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        pytest.skip("make_tiny_models.py needs torch and transformers")
    bare = _bare_python()
    bindir = tmp_path / "bin"
    bindir.mkdir()
    os.symlink(bare, bindir / "python3")
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPECTRACE", "PYTHON"))}
    env.update(
        PATH=f"{bindir}{os.pathsep}{env.get('PATH', '')}",
        TMPDIR=str(tmp_path),
        OUT=str(out),
        CARRY_TAR=_fake_site_tarball(tmp_path),
        MODELS_PYTHON=sys.executable,
        STAGGER_S="0",
        STOP_NUDGE_S="3",
        PORT_BASE=str(_free_port_base()),
        BENCH_ROUNDS="4",
        BENCH_BATCH="4",
        BENCH_MAX_NEW="8",
        FAKE_REFUSE_EXTRA="1",
    )
    proc = subprocess.run(["bash", SCRIPT, "all"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]

    returned = sorted(os.listdir(out))
    assert returned == ["logs.tar.gz", "run.log", "summary.json", "summary.md", "traces.tar.gz", "views.txt"]
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["variants"]) == ["healthy", "eagle", "nolmhead", "layers0"]
    for name, v in summary["variants"].items():
        assert "up after" in v["server"], (name, v["server"])
        # The generated dist-info is visible to the spawned child, and the .pth activated it.
        assert any(
            "fake scheduler: plugins ['spectrace.integrations.sglang.plugin:register'] spectrace active True" in ln
            for ln in _log_lines(tmp_path, name)
        ), name
        files = v["trace_files"]
        assert len(files) == 1 and files[0]["closed"], (name, files)
        assert files[0]["types"]["acceptance"] == 12
        assert v["trace"]["acceptance_mean"] == 1.0
        assert v["client"]["mean_spec_accept_length"] == 1.0 and not v["client"]["errors"]
        assert v["log"]["accept_len_last"] == 1.0
        # The first start was refused for the extra flag; the retry without it came up.
        assert os.path.exists(tmp_path / "spectrace-live" / "logs" / f"server-{name}.refused.log")
    # The EAGLE stand-in never exits on ShutdownReq: the nudge flushed it.
    assert any("nudged" in n for n in summary["variants"]["eagle"]["server_notes"])
    assert not any("nudged" in n for n in summary["variants"]["healthy"]["server_notes"])

    ov = summary["overhead"]
    assert list(ov["servers"]) == ["overhead-off-1", "overhead-on-1", "overhead-on-2", "overhead-off-2"], ov.get("servers")
    assert ov["rounds"] == 16 and set(ov["median_tok_s"]) == {"off", "on"} and ov["ratio_of_medians"] > 0
    assert ov["aa_off"] > 0 and ov["aa_on"] > 0 and all(v > 0 for v in ov["pair_ratios"].values())
    assert len(ov["trace_files_on"]) == 2 and all(f["closed"] for f in ov["trace_files_on"])
    assert all(f["hook_calls"] > 0 and f["hook_us_per_step"] > 0 for f in ov["trace_files_on"])  # accounting reached the file
    assert all(f["hook_us_per_step_by_feature"].get("graph_replay", 0) > 0 for f in ov["trace_files_on"])  # split by hook
    assert "us of spectrace hooks per verify step" in (out / "summary.md").read_text()
    for name in ("overhead-off-1", "overhead-off-2"):  # SPECTRACE unset: no trace at all
        folder = tmp_path / "spectrace-live" / "traces" / name
        assert not folder.is_dir() or not os.listdir(folder)

    views = (out / "views.txt").read_text()
    for name in ("healthy", "eagle", "nolmhead", "layers0", "overhead-on-1", "overhead-on-2"):
        assert f"===== spectrace view {name} =====" in views
    assert "| healthy |" in (out / "summary.md").read_text()
    with tarfile.open(out / "traces.tar.gz") as tf:
        names = tf.getnames()
    assert any(n.startswith("traces/eagle/trace-") for n in names) and "views/eagle.json" in names


def _log_lines(tmp_path, name):
    with open(tmp_path / "spectrace-live" / "logs" / f"server-{name}.log", encoding="utf-8") as fh:
        return fh.read().splitlines()


def test_steal_share_is_the_hypervisors_part_of_the_cpu_time_between_readings():
    before = [100, 0, 50, 800, 10, 0, 5, 35]
    after = [160, 0, 80, 880, 10, 0, 10, 60]  # 200 jiffies passed, 25 of them stolen
    assert lk.steal_share(before, after) == 0.125
    assert lk.steal_share(None, after) is None and lk.steal_share(before, before) is None
    reading = lk.cpu_times()
    assert reading is None or (len(reading) == 8 and all(v >= 0 for v in reading))


def test_make_trained_models_writes_the_shipped_pair_and_its_variants(tmp_path):
    from safetensors.torch import load_file

    script = os.path.join(LIVE, "make_trained_models.py")
    for flags, gone in (([], set()), (["--ids", "0,1,3", "--no-lm-head"], {"lm_head.weight"}), (["--no-d2t"], {"d2t"})):
        out = tmp_path / "-".join(flags or ["as-shipped"])
        subprocess.run([sys.executable, script, str(out), *flags], check=True, capture_output=True, timeout=120)
        draft = load_file(str(out / "tiny-eagle3" / "model.safetensors"))
        shipped = load_file(os.path.join(ROOT, "spectrace", "eagle3", "data", "draft.safetensors"))
        assert set(shipped) - set(draft) == gone
        config = json.load(open(out / "tiny-eagle3" / "config.json"))
        ids = config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
        assert ids == ([0, 1, 3] if "--ids" in flags else [-1, 1, 3])
        assert config["trained_aux_boundaries"] == [0, 2, 4]  # what it was trained on stays stated
        target = json.load(open(out / "tiny-llama" / "config.json"))
        assert target["architectures"] == ["LlamaForCausalLM"] and (out / "tiny-llama" / "model.safetensors").exists()


def test_probe_prompts_file_is_the_pairs_own_language():
    given, max_new = lk.load_prompts(os.path.join(ROOT, "spectrace", "eagle3", "data", "demo.json"))
    assert len(given) == 6 and max_new == 40
    assert all(0 <= t < 128 for p in given for t in p)


def test_decode_samples_read_sglangs_decode_lines():
    got = lk._decode_samples(SERVER_LOG)
    assert got[-1] == (7, 1.0, 2000.0) and got[-2] == (32, 1.0, 10400.0)
    assert len(got) == sum("#running-req" in ln and "gen throughput" in ln for ln in SERVER_LOG.splitlines())


def test_quad_ratios_cancel_a_linear_drift_and_show_the_aa_spread():
    # on off off on, twice: 1 % cost on top of a steady drift of +1 per window.
    rates = []
    for w in range(8):
        base = 100.0 + w
        rates.append(base * (0.99 if ["on", "off", "off", "on"][w % 4] == "on" else 1.0))
    per_window = [{"r": r} for r in rates]
    got = lk.quad_ratios(per_window, "r")
    assert got["quads"] == 2
    assert abs(got["on_over_off"] - 0.99) < 1e-3  # the drift cancels inside a quad
    assert got["ci95"][0] <= got["on_over_off"] <= got["ci95"][1]
    # A/A: the two on windows differ by the drift of 3 windows (about 3 %), the off ones by 1.
    assert 0.95 < got["aa_on_per_quad"][0] < 0.98 and 0.98 < got["aa_off_per_quad"][0] < 1.0
    # A window with no decode lines (NaN) leaves its quad out instead of poisoning the mean.
    per_window[1]["r"] = float("nan")
    assert lk.quad_ratios(per_window, "r")["quads"] == 1


def test_pyspy_digest_shares_by_thread_and_spectrace_frames():
    raw = "\n".join(
        [
            'Thread 0x1 (active): "MainThread";event_loop (scheduler.py:10);replay (cuda_graph_runner.py:5) 70',
            'Thread 0x1 (active): "MainThread";event_loop (scheduler.py:10);around_replay (spectrace/integrations/sglang/graph_stats.py:160) 10',
            'Thread 0x2 (active): "spectrace-records";_loop (spectrace/hooks/worker.py:170);readout_fields (spectrace/hooks/graph_records.py:30) 20',
            "not a stack line",
        ]
    )
    got = lk.pyspy_digest(raw)
    main = next(v for k, v in got.items() if "MainThread" in k)
    worker = next(v for k, v in got.items() if "spectrace-records" in k)
    assert main["samples"] == 80 and main["share_of_samples"] == 0.8 and main["in_spectrace"] == 0.125
    assert worker["in_spectrace"] == 1.0 and list(worker["top_spectrace_frames"].values()) == [20]
    assert "readout_fields" in next(iter(worker["top_spectrace_frames"]))


def test_make_trained_models_realworld_bugs(tmp_path):
    from safetensors.torch import load_file

    script = os.path.join(LIVE, "make_trained_models.py")
    shipped = load_file(os.path.join(ROOT, "spectrace", "eagle3", "data", "draft.safetensors"))
    flags = ["--ids", "0,1,3", "--d2t-arange", "--draft-vocab-null", "--rope-theta", "500000"]
    subprocess.run([sys.executable, script, str(tmp_path), *flags], check=True, capture_output=True, timeout=120)
    draft = load_file(str(tmp_path / "tiny-eagle3" / "model.safetensors"))
    n = shipped["d2t"].shape[0]
    assert draft["d2t"].tolist() == list(range(n))  # offsets replaced by absolute ids: draft id i -> target 2i
    assert set(draft) == set(shipped)
    config = json.load(open(tmp_path / "tiny-eagle3" / "config.json"))
    assert config["draft_vocab_size"] is None and config["rope_theta"] == 500000.0


def test_probe_sends_the_temperature_it_is_given(monkeypatch):
    sent = []

    def fake_post(port, body, timeout):
        sent.append(body["sampling_params"]["temperature"])
        n = len(body["input_ids"]) if isinstance(body["input_ids"][0], list) else 1
        out = {"output_ids": [1, 2], "meta_info": {"spec_accept_length": 2.0, "spec_verify_ct": 1}}
        return [out] * n if n > 1 else out

    monkeypatch.setattr(lk, "_post", fake_post)
    assert lk.probe(1, n_single=2, batch=2)["temperature"] == 0.0 and set(sent) == {0.0}
    sent.clear()
    res = lk.probe(1, n_single=2, batch=2, temperature=1.0)
    assert set(sent) == {1.0} and res["mean_spec_accept_length"] == 2.0


def test_make_trained_models_probe_variants_pad_the_target_with_a_no_op_block(tmp_path):
    # mode probe: SGLang 0.5.17's Llama cannot capture boundary 0 (the embedding); a block in
    # front whose o_proj and down_proj are zero passes the residual stream on unchanged, so the
    # padded target's boundary b + 1 is the shipped one's boundary b, bit for bit.
    import torch
    from safetensors.torch import load_file
    from transformers import LlamaConfig, LlamaForCausalLM

    script = os.path.join(LIVE, "make_trained_models.py")
    subprocess.run(
        [sys.executable, script, str(tmp_path), "--pad-block", "--rope-style", "gptj"], check=True, capture_output=True, timeout=120
    )
    draft = json.load(open(tmp_path / "tiny-eagle3" / "config.json"))
    assert draft["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 2, 4] and draft["trained_aux_boundaries"] == [1, 3, 5]
    assert draft["rope_is_neox_style"] is False
    data = os.path.join(ROOT, "spectrace", "eagle3", "data")

    def model(config_path: str, weights: str) -> LlamaForCausalLM:
        cfg = {k: v for k, v in json.load(open(config_path)).items() if k != "architectures"}
        m = LlamaForCausalLM(LlamaConfig(**cfg)).eval()
        m.load_state_dict({k: v.float() for k, v in load_file(weights).items()}, strict=False)
        m.tie_weights()
        return m

    shipped = model(os.path.join(data, "target_config.json"), os.path.join(data, "target.safetensors"))
    padded = model(str(tmp_path / "tiny-llama" / "config.json"), str(tmp_path / "tiny-llama" / "model.safetensors"))
    assert padded.config.num_hidden_layers == shipped.config.num_hidden_layers + 1
    ids = torch.tensor([json.load(open(os.path.join(data, "demo.json")))["prompts"][0]])
    with torch.no_grad():
        a, b = shipped(ids, output_hidden_states=True), padded(ids, output_hidden_states=True)
    assert torch.equal(a.logits, b.logits)
    assert all(torch.equal(a.hidden_states[k], b.hidden_states[k + 1]) for k in range(len(a.hidden_states) - 1))
    assert torch.equal(b.hidden_states[1], b.hidden_states[0])  # boundary 1 of the padded target is the embedding


def test_probe_prompts_are_the_pairs_language_then_the_demo_prompts(tmp_path):
    out = tmp_path / "p.json"
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, os.path.join(LIVE, "probe_prompts.py"), str(out), "--length", "96"], check=True, env=env, timeout=120)
    given, max_new = lk.load_prompts(str(out))
    assert [len(p) for p in given[:4]] == [96] * 4 and len(given) == 10 and max_new == 64
    assert all(0 <= t < 128 for p in given for t in p) and len({tuple(p) for p in given}) == 10  # distinct: no shared prefix cached


@pytest.mark.slow
def test_dry_run_probe_mode(tmp_path):
    # Mode probe against the stand-in server (two of its five): servers with the replay settings, the pair's
    # prompts, the stop, spectrace probe on each trace and the report. The stand-in keeps no
    # replay file, so each probe must end in its one-line bad-input error (exit 2), not a crash.
    try:
        import torch  # noqa: F401
    except ImportError:
        pytest.skip("make_trained_models.py needs torch")
    bare = _bare_python()
    bindir = tmp_path / "bin"
    bindir.mkdir()
    os.symlink(bare, bindir / "python3")
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPECTRACE", "PYTHON"))}
    env.update(
        PATH=f"{bindir}{os.pathsep}{env.get('PATH', '')}",
        TMPDIR=str(tmp_path),
        OUT=str(out),
        CARRY_TAR=_fake_site_tarball(tmp_path),
        MODELS_PYTHON=sys.executable,
        STAGGER_S="0",
        STOP_NUDGE_S="3",
        PORT_BASE=str(_free_port_base()),
        PROBE_ROWS="32",
        PROBE_ONLY="probe-rope probe-shift",
    )
    proc = subprocess.run(["bash", SCRIPT, "probe"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert {"probe-report.json", "probe.txt"} <= set(os.listdir(out))
    names = ["probe-rope", "probe-shift"]
    report = json.loads((out / "probe-report.json").read_text())
    assert list(report["servers"]) == names
    for name, entry in report["servers"].items():
        assert "up after" in entry["server"] and entry["sglang_accept_length_requests"] == 1.0, name
        assert entry["probe_exit"] == "exit 2" and "spectrace probe: error:" in (entry["probe_error"] or ""), entry
        cmd = (tmp_path / "spectrace-live" / "logs" / f"cmd-{name}.txt").read_text()
        assert "SPECTRACE_REPLAY=1 SPECTRACE_REPLAY_ROWS=32" in cmd and "--disable-prefill-cuda-graph" in cmd, cmd
    work = tmp_path / "spectrace-live"
    assert json.loads((work / "models" / "probe-rope" / "tiny-eagle3" / "config.json").read_text())["rope_theta"] == 100.0
    assert json.loads((work / "models" / "probe-shift" / "tiny-llama" / "config.json").read_text())["num_hidden_layers"] == 6
    assert [len(p) for p in json.loads((work / "probe-prompts.json").read_text())["prompts"][:4]] == [32] * 4
    assert "===== spectrace probe probe-shift =====" in (out / "probe.txt").read_text()
