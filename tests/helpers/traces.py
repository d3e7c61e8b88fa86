"""Trace builders for the viewer tests: real records from spectrace.records written as JSONL.

Shapes follow a tiny target (4 layers, hidden 64) and an EAGLE-3 draft with fc 192 -> 64
and a 100-token draft vocabulary. Values are deterministic so golden files stay stable.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from pathlib import Path

from spectrace.records import (
    Acceptance,
    Call,
    Capture,
    Counters,
    Coverage,
    Fingerprint,
    Header,
    TensorMeta,
    TensorStats,
    Weights,
)
from spectrace.rules.catalogue import finding

HIDDEN = 64
T0 = 1_764_500_000.0
STEPS = 12


def write_trace(path: Path, records: Iterable[object]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        for r in records:
            fh.write(r.model_dump_json() + "\n")  # type: ignore[attr-defined]
    return path


def header(pid: int = 4242, rank: int | None = 0, version: int = 1) -> Header:
    return Header(
        schema_version=version,
        spectrace_version="0.1.0",
        pid=pid,
        host="node1",
        rank=rank,
        argv=["python", "-m", "sglang.launch_server"],
        started_unix=T0,
    )


def meta(arg: str, shape: list[int], std: float, mean: float = 0.0, absmax: float | None = None, **kw: int) -> TensorMeta:
    n = 1
    for d in shape:
        n *= d
    stats = TensorStats(mean=mean, std=std, absmax=absmax if absmax is not None else 4 * std, nan=kw.get("nan", 0), inf=0, numel=n)
    return TensorMeta(arg=arg, shape=shape, dtype="torch.bfloat16", device="cuda:0", stats=stats)


def call(step: int, seq: int, module: str, mtype: str, root: str, ins: list[TensorMeta], outs: list[TensorMeta]) -> Call:
    return Call(step=step, seq=seq, module=module, module_type=mtype, root=root, inputs=ins, outputs=outs, t_unix=T0 + 1 + step * 0.5)


def capture(boundaries: list[int], ids: list[int] | None = None, enabled: bool = True) -> Capture:
    return Capture(
        module="target",
        requested_ids=ids,
        boundaries=boundaries,
        num_layers=4,
        hidden_size=HIDDEN,
        rule="sglang llama: id k captures boundary k+1",
        enabled=enabled,
    )


def step_calls(step: int, rng: random.Random, *, fc: bool = True, chunk_std: tuple[float, float, float] = (1.0, 1.2, 1.5)) -> list[Call]:
    j = lambda: 1 + rng.uniform(-0.02, 0.02)  # noqa: E731 - small, deterministic jitter
    out: list[Call] = []
    seq = step * 10
    width = 3 * HIDDEN if fc else HIDDEN
    if fc:
        out.append(
            call(step, seq, "target.model.aux_concat", "AuxConcat", "target", [], [meta("output", [4, width], sum(chunk_std) / 3 * j())])
        )
        out.append(
            call(
                step,
                seq + 1,
                "draft.model.fc",
                "Linear",
                "draft",
                [meta("input[0]", [4, width], 1.2 * j())],
                [meta("output", [4, HIDDEN], 0.8 * j())],
            )
        )
    out.append(
        call(
            step,
            seq + 2,
            "draft.model.layers.0",
            "LlamaDecoderLayer",
            "draft",
            [meta("input[0]", [4, 2 * HIDDEN], 0.9 * j())],
            [meta("output", [4, HIDDEN], 1.1 * j())],
        )
    )
    out.append(
        call(
            step,
            seq + 3,
            "draft.model.norm",
            "RMSNorm",
            "draft",
            [meta("input[0]", [4, HIDDEN], 1.1 * j())],
            [meta("output", [4, HIDDEN], 1.0 * j())],
        )
    )
    out.append(
        call(
            step,
            seq + 4,
            "draft.lm_head",
            "Linear",
            "draft",
            [meta("input[0]", [4, HIDDEN], 1.0 * j())],
            [meta("output", [4, 100], 2.5 * j(), mean=-0.1)],
        )
    )
    return out


def fingerprint(step: int, rng: random.Random, chunk_std: tuple[float, float, float], boundaries: list[int]) -> Fingerprint:
    chunks = [
        TensorStats(mean=0.01 * (i + 1), std=s * (1 + rng.uniform(-0.01, 0.01)), absmax=6 * s, nan=0, inf=0, numel=4 * HIDDEN)
        for i, s in enumerate(chunk_std)
    ]
    return Fingerprint(module="target.model.aux_concat", chunk_width=HIDDEN, chunks=chunks, boundaries=boundaries)


def acceptance(step: int, mean_len: float, rng: random.Random, k: int = 4) -> Acceptance:
    lengths = [max(1, min(k + 1, round(mean_len + rng.uniform(-1, 1)))) for _ in range(4)]
    per_pos = [sum(1 for n in lengths if n - 1 > i) for i in range(k)]
    return Acceptance(step=step, accept_lengths=lengths, draft_tokens=k, accepted_per_position=per_pos)


def weights(missing: list[str] | None = None, ignored: list[str] | None = None) -> Weights:
    written = ["model.fc.weight", "model.layers.0.self_attn.qkv_proj.weight", "model.norm.weight", "lm_head.weight", "hot_token_id"]
    written = [w for w in written if w not in (missing or [])]
    return Weights(
        module="draft",
        offered=written + (ignored or []),
        written=written,
        ignored=ignored or [],
        missing=missing or [],
        source="draft/model.safetensors",
    )


def healthy_records(
    steps: int = STEPS, boundaries: list[int] | None = None, chunk_std: tuple[float, float, float] = (1.0, 1.2, 1.5)
) -> list[object]:
    rng = random.Random(1)
    bounds = boundaries or [1, 2, 3]
    recs: list[object] = [header(), capture(bounds, ids=[b - 1 for b in bounds]), weights()]
    for s in range(steps):
        recs += step_calls(s, rng, chunk_std=chunk_std)
        recs.append(fingerprint(s, rng, chunk_std, bounds))
        recs.append(acceptance(s, 3.0, rng))
    recs.append(Counters(steps=steps, calls_seen=5 * steps, records_written=7 * steps))
    return recs


def fc_bypass_records(steps: int = STEPS) -> list[object]:
    """Bug 1 on top of bug 2's cousin: no aux capture, fc skipped, lm_head never loaded."""
    rng = random.Random(2)
    recs: list[object] = [header(pid=777), capture([], ids=[0, 1, 2], enabled=False), weights(missing=["lm_head.weight"])]
    recs.append(
        finding(
            "weights_missing",
            "1 draft parameter not written by the checkpoint: lm_head.weight",
            module="draft.lm_head",
            evidence={"missing": ["lm_head.weight"]},
            source="weights",
        )
    )
    for s in range(steps):
        recs += step_calls(s, rng, fc=False)
        if s % 4 == 0:
            recs.append(
                finding(
                    "fc_bypass",
                    "draft got 64-wide hidden states, fc expects 192; fc skipped",
                    module="draft.model.fc",
                    evidence={"seen_width": 64, "fc_in_features": 192},
                    step=s,
                )
            )
        recs.append(acceptance(s, 1.1 if s > 2 else 2.0, rng))
    recs.append(finding("acceptance_collapse", "accept length 1.05 over steps 3..11", evidence={"window": 9, "mean": 1.05}, step=11))
    recs.append(Coverage(kind="graph_replay", detail="draft decode ran as a CUDA graph", count=40))
    recs.append(Coverage(kind="dropped", detail="ring buffer full", count=5))
    recs.append(
        Counters(
            steps=52,
            calls_seen=60,
            records_written=70,
            records_dropped=17,
            graph_replay_steps=40,
            dropped_by_reason={"record cap": 12, "sink error": 5},
        )
    )
    return recs


def layer_mismatch_records(steps: int = STEPS) -> list[object]:
    """Bug 3: same 192 width, but chunk 0 is the embedding output (tiny scale)."""
    chunk_std = (0.02, 1.2, 1.5)
    recs = healthy_records(steps, boundaries=[0, 2, 3], chunk_std=chunk_std)
    recs.insert(
        3,
        finding(
            "aux_layers_mismatch",
            "target captures boundaries [0, 2, 3], draft trained on [1, 2, 3]",
            module="target",
            evidence={"captured": [0, 2, 3], "trained": [1, 2, 3]},
        ),
    )
    return recs
