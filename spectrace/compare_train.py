"""``spectrace compare-train TRACE --target HF_MODEL_DIR --draft-config CONFIG``: provenance by value.

A trace written with ``SPECTRACE_CAPTURE_VALUES=N`` has the first N rows of the served
fused draft input and their token ids beside it (``*.values.safetensors``). This command
recomputes, with transformers, the target's hidden states for the same token ids
(``output_hidden_states=True``: index 0 is the embedding output, index b the output of
block b-1), splits each served row into its chunks of the target's hidden width, and
prints each chunk's cosine against the boundaries. What the draft was trained on comes
from the draft's config.json (its stated training, else its layer ids read under the
trainer conventions). The judgement is ``checks.values``': a chunk that is another
boundary than the trained one is ``values_boundary_mismatch``, one that is none is
``values_chunk_unmatched``.

    $ SPECTRACE=1 SPECTRACE_CAPTURE_VALUES=32 SPECTRACE_DIR=traces python serve.py
    $ spectrace compare-train traces --target ./tiny-llama --draft-config ./tiny-eagle3/config.json

The command's arguments and exit status are ``cli/compare_train.py``'s.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .checks.values import ChunkMatch, boundary_label, check_values, match_chunks
from .present.findings import brief_lines
from .records import Finding
from .rules.readings import aux_ids, readings

ALL_BOUNDARIES_SHOWN = 16  # a deeper target's full cosine rows are in --json


def _short_label(b: int) -> str:
    return "emb" if b == 0 else f"b{b}"


class InputError(Exception):
    """Unusable input: one line on stderr, exit 2."""


@dataclass
class Comparison:
    """The outcome for one values file."""

    values_file: str
    steps: int
    rows: int
    matches: list[ChunkMatch]
    trained: list[int] | None
    trained_source: str
    num_layers: int
    findings: list[Finding]
    other_readings: list[tuple[str, list[int]]]  # (trainer convention, boundaries) the config's ids could also mean


def values_records(trace: str) -> list[tuple[str, list[int] | None, str | None]]:
    """(values file path, captured boundaries, capture rule) per values record of the trace."""
    from .viewers.loader import load_traces

    if not os.path.exists(trace):
        raise InputError(f"no trace at {trace}")
    ts = load_traces(trace)
    if not ts.files:
        raise InputError(f"{trace} holds no trace file (trace-*.jsonl)")
    found = []
    for f in ts.files:
        capture = f.captures[-1] if f.captures else None
        captured = list(capture.boundaries) if capture is not None and capture.enabled else None
        rule = capture.rule if capture is not None else None
        for record in f.values:
            name = os.path.basename(record.file)  # a name in the trace's own folder, never a path elsewhere
            found.append((os.path.join(os.path.dirname(f.path), name), captured, rule))
    if not found:
        raise InputError(
            f"{trace} holds no values record: trace the run with SPECTRACE_CAPTURE_VALUES=N "
            "(the fused draft input must be seen in a forward from position 0: a prefill)"
        )
    return found


def read_draft_config(path: str) -> dict[str, Any]:
    file = os.path.join(path, "config.json") if os.path.isdir(path) else path
    try:
        with open(file, encoding="utf-8") as handle:
            config = json.load(handle)
    except FileNotFoundError:
        raise InputError(f"no draft config at {file}")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{file} is not a JSON config: {type(exc).__name__}")
    if not isinstance(config, dict):
        raise InputError(f"{file} is not a JSON object")
    return config


def load_target(path: str, dtype: str = "float32") -> Any:
    try:
        import torch
        from transformers import AutoModelForCausalLM
    except ImportError as exc:
        raise InputError(f"compare-train needs transformers (pip install 'spectrace[transformers]'): {exc}")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # the command draws its own progress, on a terminal only
    except Exception:
        pass
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    except Exception as exc:
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        raise InputError(f"cannot load the target {path} with transformers: {first}")
    return model.eval()


def _text_config(model: Any) -> Any:
    config = model.config
    return getattr(config, "text_config", None) or config


def compare(
    values_path: str,
    model: Any,
    draft_config: dict[str, Any],
    captured: list[int] | None,
    rule: str | None,
    progress: Callable[[int, int], None] | None = None,
) -> Comparison:
    """Recompute the target's boundaries for the kept ids and match each chunk (float32, CPU);
    ``progress(done, total)`` after each step's forward (a large target takes seconds each)."""
    import torch
    import torch.nn.functional as F

    from .values_file import ValuesFileError, read_values

    try:
        meta, steps = read_values(values_path)
    except ValuesFileError as exc:
        raise InputError(str(exc))
    config = _text_config(model)
    hidden, num_layers, vocab = int(config.hidden_size), int(config.num_hidden_layers), int(config.vocab_size)
    if meta.width % hidden:
        raise InputError(
            f"the fused rows are {meta.width} wide, not a multiple of the target's hidden size {hidden}: --target is another model"
        )
    chunks = meta.width // hidden
    found = readings(draft_config, num_layers)
    trained = list(found[0].boundaries) if found else None
    if trained is not None and chunks != len(trained):
        raise InputError(
            f"the fused rows are {meta.width} wide, {chunks} chunks of the target's hidden size {hidden}, but the draft was "
            f"trained on {len(trained)}: --target is another model"
        )
    sums = torch.zeros(chunks, num_layers + 1, dtype=torch.float64)
    rows = 0
    with torch.no_grad():
        for done, s in enumerate(steps, 1):
            if int(s.input_ids.max()) >= vocab or int(s.input_ids.min()) < 0:
                raise InputError(f"token ids of step {s.step} lie outside the target's vocabulary of {vocab}: --target is another model")
            out = model(input_ids=s.input_ids.view(1, -1), output_hidden_states=True, use_cache=False)
            states = out.hidden_states
            if len(states) != num_layers + 1:
                raise InputError(f"the target returned {len(states)} hidden states for {num_layers} layers")
            fused = s.fused.float()
            for c in range(chunks):
                chunk = fused[:, c * hidden : (c + 1) * hidden]
                for b, state in enumerate(states):
                    sums[c, b] += F.cosine_similarity(chunk, state[0].float(), dim=-1).double().sum()
            rows += int(s.fused.shape[0])
            if progress is not None:
                progress(done, len(steps))
    if not rows:
        raise InputError(f"{values_path} holds no rows")
    matches = match_chunks((sums / rows).tolist())
    source = f"{found[0].source}, {found[0].convention}" if found else ""
    findings = check_values(
        matches,
        trained,
        num_layers=num_layers,
        captured=captured if captured is not None else meta.boundaries,
        rule=rule,
        values_file=os.path.basename(values_path),
        trained_source=source,
        config_ids=aux_ids(draft_config)[0],
    )
    others = [(r.convention, list(r.boundaries)) for r in found[1:]]
    return Comparison(os.path.basename(values_path), len(steps), rows, matches, trained, source, num_layers, findings, others)


def report_lines(c: Comparison) -> list[str]:
    """What the terminal shows for one comparison: one line per chunk, then the findings."""
    n = c.num_layers
    lines = [f"{c.values_file}: {c.rows} token rows over {c.steps} step{'s' if c.steps != 1 else ''}, {len(c.matches)} chunks"]
    if c.trained is not None:
        trained = ", ".join(boundary_label(b, n) for b in c.trained)
        lines.append(f"the draft was trained on [{trained}] ({c.trained_source})")
        for convention, boundaries in c.other_readings:
            other = ", ".join(boundary_label(b, n) for b in boundaries)
            lines.append(f"  (under the {convention} convention the ids would mean [{other}]; stamp trained_aux_boundaries to settle it)")
    for m in c.matches:
        best = m.best
        runner = [b for b in m.ranked(3) if b != best][:1]
        text = (
            f"chunk {m.chunk} matches {boundary_label(best, n)} at {m.cosines[best]:.3f}"
            if m.matched
            else (f"chunk {m.chunk} matches no boundary (best {boundary_label(best, n)} at {m.cosines[best]:.3f})")
        )
        want = c.trained[m.chunk] if c.trained is not None and m.chunk < len(c.trained) else None
        if want is not None and want != best:
            text += f", {boundary_label(want, n)} at {m.cosines[want]:.3f}; the draft was trained on {boundary_label(want, n)}"
        elif runner:
            text += f" (next: {boundary_label(runner[0], n)} at {m.cosines[runner[0]]:.3f})"
            if want is not None:
                text += ", as trained"
        lines.append(text)
        if len(m.cosines) <= ALL_BOUNDARIES_SHOWN:
            lines.append("  " + "  ".join(f"{_short_label(b)} {cos:.3f}" for b, cos in enumerate(m.cosines)))
    if c.matches and len(c.matches[0].cosines) <= ALL_BOUNDARIES_SHOWN:
        lines.append("(emb: the embedding; bk: out(block k-1), the last one normed; cosines averaged over the token rows)")
    lines += brief_lines(c.findings)
    if not c.findings:
        lines.append("every chunk is the boundary the draft was trained on")
    return lines


def to_json(results: list[Comparison]) -> str:
    """What ``--json`` prints: per values file, the cosines, the matched boundaries, the findings."""
    return json.dumps(
        [
            {
                "values_file": c.values_file,
                "rows": c.rows,
                "steps": c.steps,
                "trained_boundaries": c.trained,
                "cosines": [list(m.cosines) for m in c.matches],
                "matched_boundaries": [m.matched for m in c.matches],
                "findings": [f.model_dump(mode="json") for f in c.findings],
            }
            for c in results
        ],
        indent=1,
    )
