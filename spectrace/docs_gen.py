"""The reference pages that are generated from the code, never written by hand.

- ``docs/findings.md``: every finding code of :data:`spectrace.rules.catalogue.CATALOGUE` with its
  severity, cause and fix, and the evidence keys its findings carry (read from the
  ``finding(...)`` calls in spectrace's own source);
- ``docs/trace-format.md``: every record type of :mod:`spectrace.records`, field by field.

Rewrite both from the repository root (``--check`` only reports stale pages, exit 1)::

    python -m spectrace.docs_gen [--check] [--root DIR]

``tests/docs/test_docs.py`` fails while either page differs from what this module generates.

    >>> "fc_bypass" in findings_markdown()
    True
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import sys
import types
import typing
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel

from . import records
from .checks.root_causes import RULE_BY_CODE, RULES
from .rules.catalogue import CATALOGUE

PACKAGE = Path(__file__).resolve().parent
REGENERATE = "python -m spectrace.docs_gen"

# ---------------------------------------------------------------------------- findings

# What each evidence key holds. Keys are read from the source (``_scan``); a key that is
# found there and missing here is reported by tests/docs/test_docs.py.
EVIDENCE_KEYS: dict[str, str] = {
    "algorithm": "the speculative algorithm the engine runs (`EAGLE`, `EAGLE3`, ...)",
    "architectures": "`architectures` of the draft's config.json",
    "arg": "which argument of the call held the values (`input[0]`, `output`, ...)",
    "arange_default": "whether the draft->target ids are 2i, what a trainer's placeholder `d2t = arange(draft_vocab_size)` gives",
    "aux_enabled": "whether the target had aux-hidden-state capture switched on",
    "boundaries": "the boundaries the target captures (Hugging Face `hidden_states[b]`: 0 the embedding output, b the output of block b-1)",
    "by_prefix": "how many names fall under each name prefix",
    "calls_affected": "how many calls of that module held non-finite values",
    "capture_hidden_mode": "the logits metadata's capture mode (`FULL`, `LAST`, ...)",
    "captured_boundaries": "the boundaries the target captured, or null when no capture was seen",
    "chunks": "per skewed chunk index, why it no longer looks like training (std or mean moved)",
    "default_ids": "the ids vLLM's target falls back to when its runner reads none: (2, n//2, n-3)",
    "nested_ids": "`eagle_config.eagle_aux_hidden_state_layer_ids`, which vLLM's Model Runner V2 does not read",
    "reachable": "the boundaries among the requested ids that vLLM's Llama-family target can capture (0..n)",
    "returned": "how many aux hidden states the target's first forward really returned",
    "decoder_input_width": "width of the hidden states the draft's decoder layer received",
    "delivered": "width the target delivers: captured layers x target hidden size",
    "draft_rope": "the draft's rotary embedding as the engine builds it: from config.json (`spectrace audit`) `rope_theta` and the key it was read from (`default`: none it reads), `rope_type`, `factor`, `partial_rotary_factor`, `head_dim`, `is_neox_style`; at runtime the engine's rotary module itself: `module`, `class`, `rope_theta`, `rope_type`, `factor`, `rotary_dim`, `head_size`, `is_neox_style`",
    "draft_target_hidden": "the target hidden size the draft config states",
    "draft_tokens": "draft tokens proposed per verify step (k)",
    "draft_vocab_size": "`draft_vocab_size` of the draft config",
    "dropped": "checkpoint tensor names no parameter consumed",
    "dropped_ids": "the ids the engine's capture loop never reaches (past the target's last layer), dropped without a word",
    "eagle_config_ids": "`eagle_config.eagle_aux_hidden_state_layer_ids` of the draft config",
    "embed_width": "the draft's embedding width (a fused input this wide makes the engine skip fc)",
    "enabled": "whether aux capture is on in the target",
    "engine": "the engine the check is for (`sglang`, `vllm`)",
    "engine_boundaries": "the boundaries the engine's target captures from the ids it reads",
    "engine_fc_in": "the fc input width the engine builds",
    "engine_ids": "the layer ids the engine reads from the config, or null for its defaults",
    "engine_ids_source": "where the engine reads them (`eagle_config.eagle_aux_hidden_state_layer_ids`, defaults, ...)",
    "fix_ids": "the layer ids to write in eagle_config so the target captures the trained boundaries (null: none do)",
    "engine_rule": "the engine rule that maps ids to boundaries (`sglang_llama`, `sglang_deepseek`, ...)",
    "engine_version": "the engine release the check read (`0.5.17`, ...)",
    "expected": "the shape the engine loads the tensor as",
    "fc_in_features": "`fc.in_features` (or the width of the buffer fc feeds)",
    "first_ids": "the target ids of the first draft ids, as the map gives them",
    "first_step": "the first step where it happened",
    "flag": "the config flag",
    "built_class": "the draft class the engine builds for the checkpoint's `architectures` (`spectrace audit`: from SGLang's renames and registry; at runtime: the class of the model the draft worker built)",
    "class_kind": "what that class is: `nextn` (a multi-token-prediction head) or `eagle` (an EAGLE-1 draft)",
    "draft_class": "the engine's draft class that reads (or does not read) the flag",
    "runner_reads_flag": "whether vLLM's Model Runner V2 of that release reads `use_aux_hidden_state` before asking the target for aux states",
    "forward_mode": "SGLang's forward mode of the batch (`EXTEND`, `DECODE`, ...)",
    "hidden_size": "the draft's hidden size",
    "target_hidden_size": "`target_hidden_size` as the draft's config.json writes it (null: taken as a value by SGLang)",
    "inf": "count of infinite values in the first such tensor",
    "kind": "which limit: `embedding` (the embedding output cannot be captured) or `short` (fewer layers reached than ids)",
    "missing": "parameter names no checkpoint tensor wrote",
    "nan": "count of NaN values in the first such tensor",
    "checkpoint_has_fc": "whether the checkpoint holds an fc tensor (a trained fc: the draft was trained on fused aux states)",
    "same_as_engine_capture": "whether the engine's defaults capture the very boundaries the ignored ids name (nothing lost)",
    "trainer": "the trainer(s) of the draft: known from a record or recognised from the checkpoint's layout (empty: unknown)",
    "trainer_from": "how the trainer is known: `record` (--trained-with, the folder's run files, provenance keys) or `signature` (the layout)",
    "trainer_why": 'what said which trainer it was ("SpecForge: midlayer.* tensors and eagle_config")',
    "trained_rope": "the rotary each candidate trainer (and release) trained with from this config: `rope_theta`, `rope_type`, `factor`, the rule and its source",
    "trained_rope_theta": "the base a record states the draft was trained with (run.yaml, train_command.txt, trained_rope_theta)",
    "trained_from": "the record that stated the trained base",
    "not_read": "rotary values the draft's config.json writes where the engine does not read them (key path -> value)",
    "num_aux": "how many aux layers the target delivers",
    "num_layers": "the target's layer count",
    "numel": "number of values in that tensor",
    "parameters": "parameter names no checkpoint tensor wrote",
    "problems": "each thing wrong with the map, with its figures (length, range, order, t2d, the checkpoint's d2t)",
    "read_in": "the source lines of the release that the rule was read from",
    "readings": "each trainer convention's reading of the config: `{convention: {ids, boundaries, source}}`",
    "reference_boundaries": "the boundaries of the training fingerprint",
    "reference_chunks": "chunks in the training fingerprint",
    "releases": "the release range the rule holds for",
    "rename": "the rename that maps these tensors onto parameters: `{from, to}`",
    "rename_map": "name prefix renames that map the dropped names onto the missing ones",
    "requested_ids": "the layer ids the target was asked to capture (null: the engine's defaults)",
    "rule": "the engine rule that maps ids to boundaries",
    "run_mean": "mean accept length over the run (live: the run so far)",
    "run_steps": "verify steps that mean is over",
    "runner": "the CUDA-graph runner class",
    "seen_boundaries": "the boundaries the fused input was built from",
    "seen_chunks": "chunks in the fused draft input",
    "seen_width": "width of the hidden states the draft received",
    "shape": "the tensor's shape in the checkpoint",
    "stored_width": "width of the hidden state the logits processor stored for the draft",
    "steps_bypassed": "how many steps ran the draft's decoder layer without fc",
    "supported_since": "the first release whose target captures the embedding, or null",
    "target_class": "the target model class (`LlamaForCausalLM`, ...)",
    "target_class_assumed": "set by `spectrace audit` without `--target-config`: a Llama target was assumed",
    "target_family": "the target family the release table is read for (`llama`, `deepseek`, `plus_one`, `deepseek_rule`, `gpt_oss`, `minimax_m3_vl`)",
    "trained_with": "the trainer that wrote the draft, when known for certain (`--trained-with`, `SPECTRACE_TRAINED_WITH`, the folder's record); None: unknown",
    "target_hidden": "the target's hidden size",
    "target_layers": "the target's layer count, or null when it is not known",
    "target_rope": "the target's rotary embedding as the engine builds it (as `draft_rope`; several bases for one rotary per attention type; at runtime, one entry per distinct rotary module of the target)",
    "observed": "what the runtime check read (`the engine's rotary modules`, `the draft model the engine built`), where an offline check reads config.json",
    "draft_config_rope": "the draft's rotary as its config.json reads (as `draft_rope` offline), beside the one the engine built: which key its base came from",
    "target_vocab": "the target's vocabulary size",
    "tensor": "the checkpoint tensor's name",
    "tensors": "checkpoint tensor names no parameter consumed",
    "top_level_ids": "`eagle_aux_hidden_state_layer_ids` at the top level of the draft config",
    "trained_boundaries": "the boundaries the draft was trained on",
    "use_aux_hidden_state": "`eagle_config.use_aux_hidden_state` of the draft config",
    "cosines": "`spectrace compare-train`: per chunk, its cosine against the most similar boundaries of the target recomputed for the same token ids",
    "matched_boundaries": "`spectrace compare-train`: per chunk, the boundaries it equals by value (cosine at least 0.99 and within 0.002 of its best); empty for none",
    "served_boundaries": "`spectrace compare-train`: per chunk, the boundary it is most similar to",
    "values_file": "the values file beside the trace that the rows came from (`SPECTRACE_CAPTURE_VALUES`)",
    "replay_causes": "`spectrace replay`: the causes that fit the diverging module",
    "replay_file": "`spectrace replay`: the replay file beside the trace that the inputs came from (`SPECTRACE_REPLAY`)",
    "replay_max_error": "`spectrace replay`: largest |served - reference| over the reference's largest magnitude",
    "replay_reference": "`spectrace replay`: what the reference draft computed on the same inputs (first row, first values)",
    "replay_served": "`spectrace replay`: what the served module computed (first row, first values)",
    "replay_tolerance": "`spectrace replay`: the tolerance for the served dtype",
    "probe_decided": "`spectrace probe`: the axes it measured (rope, norm_before_residual, embed, vocabulary map)",
    "probe_file": "`spectrace probe`: the replay file beside the trace whose kept rows were judged (`SPECTRACE_REPLAY`)",
    "probe_rows": "`spectrace probe`: how many rows were judged",
    "probe_rows_used": "`spectrace probe`: which rows: target-written ones (the token read is the target's own choice), or every paired row",
    "probe_served": "`spectrace probe`: the served draft's top-1 agreement with its target, its Wilson 95 % interval (low, high) and its estimated accept length (chain)",
    "probe_steps": "`spectrace probe`: k, the draft steps in the accept estimate 1 + a + ... + a^k",
    "probe_winner": "`spectrace probe`: the variant that agrees measurably better than the served draft",
    "probe_winner_agreement": "`spectrace probe`: the winner's agreement, Wilson interval and estimated accept length",
    "probe_winner_axis": "`spectrace probe`: what the winner changes (rope, norm_before_residual, embed, vocabulary map, config)",
    "value": "the flag's value",
    "vocab_size": "the target's vocabulary size",
    "wanted": "how many boundaries the draft was trained on",
    "window": "verify steps in the window",
    "window_mean": "mean accept length over the window",
    "how": "per parameter: `replaced` (another tensor now) or `changed` (overwritten in place)",
    "shared_with": "per parameter: the target parameter whose storage it now is",
    "engine_step": "the engine steps that replace such a tensor after the load",
    "trigger": "the config keys that make the engine take that step",
    "moment": "when the comparison ran (`first forward`, `CUDA-graph capture`)",
    "greedy_mean": "mean accept length of the greedy requests (temperature 0 or top_k 1) in the window",
    "sampled_mean": "mean accept length of the sampled requests in the window",
    "greedy_requests": "greedy requests verified in the window",
    "sampled_requests": "sampled requests verified in the window",
    "temperatures": "the sampled requests' temperatures (up to 8 distinct values)",
    "setting": "the engine setting that simulates acceptance, as it was read",
    "baseline_mean": "mean accept length of the run's first windows",
    "recent_mean": "mean accept length of the latest comparable windows",
    "threshold": "how far it had to fall to count (the larger of 0.5, 15% of the baseline and 3x the baseline's spread)",
    "baseline_steps": "the verify steps of the baseline windows `[first, last]`",
    "recent_steps": "the verify steps of the latest comparable windows `[first, last]`",
    "fell_in_steps": "the window where it fell `[first, last]`: the first one below the line that the run stays below",
    "baseline_prompt_len": "mean prompt length in tokens of the requests in the baseline windows",
    "recent_prompt_len": "mean prompt length in tokens of the requests in the latest comparable windows",
    "finished_requests": "finished requests judged (every one up to 256, then one in 16)",
    "looping_requests": "those whose output loops: over `loop_rate` of their n-grams repeat an earlier one",
    "loop_rate": "the share of repeated n-grams above which a request's output loops",
    "ngram": "the n of the n-grams counted",
    "looping_accept_length": "mean accept length per verify step of the looping requests",
    "other_accept_length": "mean accept length per verify step of the requests that do not loop",
    "draft_layers": "decoder layers of the model the draft worker built (null: not found)",
    "draft_params": "parameters of the model the draft worker built",
    "target_params": "parameters of the target model the target worker built",
    "position_rates": "per draft position 1..k: the share of the verified requests that accepted it",
    "second_given_first": "the share of the requests that accepted draft position 1 that accepted position 2 too",
    "requests": "requests verified (one per request per verify step) over the steps judged",
    "baseline_batch": "mean requests per verify step in the baseline",
    "recent_batch": "mean requests per verify step in the latest windows",
    "windows": "windows of verify steps the run was cut into so far",
    "config_key": "the draft config.json key that the misfit tensors follow from (`hidden_size`, `intermediate_size`, ...)",
    "config_value": "that key's value in config.json, what the engine builds the draft's tensors from",
    "weights_value": "the width the checkpoint's tensors have where the engine expects the key's value",
    "misfits": "per misfit tensor, its shape and the shape the engine expects from the config key",
}

# Evidence keys no literal in the source names: the audit adds the first to findings it
# got back; a flag's own name is the key of the audit's unsupported_config_flag.
EXTRA_EVIDENCE: dict[str, dict[str, str]] = {
    "capture_unsupported": {"target_class_assumed": EVIDENCE_KEYS["target_class_assumed"]},
    "unsupported_config_flag": {
        "<flag name>": '`spectrace audit`: the flag, as `{"norm_before_residual": true}`',
    },
}

# When a code is raised at another severity than its catalogue's.
SEVERITY_WHEN: dict[tuple[str, str], str] = {
    ("aux_layers_mismatch", "warning"): "when the likeliest reading of the config agrees with the capture but another "
    "trainer's convention (SpecForge or speculators) would not: confirm which trainer wrote the draft",
    ("capture_unsupported", "warning"): "for a release spectrace has not read, where whether it can capture the embedding is not known",
    ("rope_mismatch", "warning"): "when, with no `--target-config`, the base the engine reads and a base written where it does not "
    "disagree: which one the draft was trained with is not known",
    ("unsupported_config_flag", "warning"): "for flags whose effect is milder (under SGLang: `norm_output`, `embed_requires_grad`)",
    ("unsupported_config_flag", "info"): "for flags spectrace has not verified in vLLM (`fc_norm`, `norm_output`)",
}
# Severities chosen at run time from a table rather than written at the call.
TABLE_SEVERITIES: dict[str, set[str]] = {"unsupported_config_flag": {"warning"}}


def _is_finding_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call) or not node.args:
        return False
    func = node.func
    return (isinstance(func, ast.Name) and func.id == "finding") or (isinstance(func, ast.Attribute) and func.attr == "finding")


def _strings(expr: ast.AST | None) -> list[str]:
    """The string constants an expression can evaluate to (a constant or a conditional of them)."""
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return [expr.value]
    if isinstance(expr, ast.IfExp):
        return _strings(expr.body) + _strings(expr.orelse)
    return []


def _name_values(name: str, scope: ast.AST) -> list[str]:
    """Strings a local ``name`` is bound to in ``scope``: assignments and loops over literal tuples."""
    out: list[str] = []
    for node in ast.walk(scope):
        if isinstance(node, ast.Assign):
            if any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                out += _strings(node.value)
        elif isinstance(node, (ast.For, ast.comprehension)) and isinstance(node.iter, (ast.Tuple, ast.List)):
            for element in node.iter.elts:
                if isinstance(node.target, ast.Name) and node.target.id == name:
                    out += _strings(element)
                elif isinstance(node.target, ast.Tuple) and isinstance(element, ast.Tuple):
                    for target, value in zip(node.target.elts, element.elts):
                        if isinstance(target, ast.Name) and target.id == name:
                            out += _strings(value)
    return out


def _loop_bindings(name: str, scope: ast.AST) -> list[dict[str, str]]:
    """One binding of the loop's names per element, for a loop over literal tuples that binds ``name``."""
    out: list[dict[str, str]] = []
    for node in ast.walk(scope):
        if isinstance(node, ast.For) and isinstance(node.target, ast.Tuple) and isinstance(node.iter, (ast.Tuple, ast.List)):
            names = [t.id if isinstance(t, ast.Name) else None for t in node.target.elts]
            if name not in names:
                continue
            for element in node.iter.elts:
                if isinstance(element, ast.Tuple) and len(element.elts) == len(names):
                    env = {
                        n: v.value for n, v in zip(names, element.elts) if n and isinstance(v, ast.Constant) and isinstance(v.value, str)
                    }
                    if name in env:
                        out.append(env)
    return out


def _dict_keys(expr: ast.AST | None, scope: ast.AST, seen: frozenset[str] = frozenset(), env: dict[str, str] | None = None) -> set[str]:
    """Keys of the evidence dict ``expr``: a literal, or a local name built from literals."""
    keys: set[str] = set()
    if isinstance(expr, ast.Dict):
        for key, value in zip(expr.keys, expr.values):
            if key is None:  # {**other, ...}
                keys |= _dict_keys(value, scope, seen, env)
            elif isinstance(key, ast.Name):
                keys |= {env[key.id]} if env and key.id in env else set(_name_values(key.id, scope))
            else:
                keys |= set(_strings(key))
    elif isinstance(expr, ast.Name) and expr.id not in seen:
        name, seen = expr.id, seen | {expr.id}
        for node in ast.walk(scope):
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name) and target.id == name:
                        keys |= _dict_keys(node.value, scope, seen, env)
                    elif isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name) and target.value.id == name:
                        keys |= set(_strings(target.slice))
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "update"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == name
            ):
                keys |= {kw.arg for kw in node.keywords if kw.arg}
                for arg in node.args:
                    keys |= _dict_keys(arg, scope, seen, env)
    return keys


def _scan(package: Path = PACKAGE) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """Evidence keys and severities of every ``finding(code, ...)`` call in the package source."""
    evidence: dict[str, set[str]] = {code: set() for code in CATALOGUE}
    severities: dict[str, set[str]] = {code: set() for code in CATALOGUE}
    for path in sorted(package.rglob("*.py")):
        if "__pycache__" in path.parts or path.name == "docs_gen.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        scopes: list[ast.AST] = [tree]
        scopes += [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for scope in scopes:
            # The calls whose innermost enclosing function is this scope (lambdas included).
            stack = list(scope.body) if isinstance(scope, ast.Module) else list(ast.iter_child_nodes(scope))
            while stack:
                node = stack.pop()
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    continue
                stack.extend(ast.iter_child_nodes(node))
                if not _is_finding_call(node):
                    continue
                first = node.args[0]
                kwargs = {kw.arg: kw.value for kw in node.keywords if kw.arg}
                if isinstance(first, ast.Name) and _loop_bindings(first.id, scope):
                    # for code, ..., key, ... in ((...), (...)): each element's code with its own keys
                    uses = [(env[first.id], env) for env in _loop_bindings(first.id, scope)]
                else:
                    codes = _strings(first) or (_name_values(first.id, scope) if isinstance(first, ast.Name) else [])
                    uses = [(code, None) for code in codes]
                for code, env in uses:
                    if code in CATALOGUE:
                        evidence[code] |= _dict_keys(kwargs.get("evidence"), scope, env=env)
                        severities[code] |= set(_strings(kwargs.get("severity")))
    for code, extra in TABLE_SEVERITIES.items():
        severities[code] |= extra
    return evidence, severities


def evidence_keys(found: dict[str, set[str]] | None = None) -> dict[str, dict[str, str | None]]:
    """Per code: each evidence key its findings can carry and what it holds (None: not described)."""
    if found is None:
        found, _ = _scan()
    out: dict[str, dict[str, str | None]] = {}
    for code in CATALOGUE:
        keys: dict[str, str | None] = {key: EVIDENCE_KEYS.get(key) for key in sorted(found[code])}
        keys.update(EXTRA_EVIDENCE.get(code, {}))
        out[code] = keys
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def findings_markdown() -> str:
    found, severities = _scan()
    evidence = evidence_keys(found)
    lines = [
        "# Finding codes",
        "",
        f"Generated by `{REGENERATE}` from the catalogue in `spectrace/rules/catalogue.py` and the",
        "evidence that spectrace's checks attach; do not edit by hand.",
        "",
        "Every finding record carries its code, a severity, a message (what was seen, with the",
        "figures), the module it concerns, the step, a fix and an `evidence` object (see",
        "[trace-format.md](trace-format.md#finding)). The fix below is the code's default: most",
        "checks write a more specific one (the rename to make, the ids to write). Evidence keys",
        "depend on where the finding was raised (`spectrace audit`, a traced model, an SGLang",
        "server); each key listed appears in at least one of them. `error` means a wiring or",
        "weight bug that degrades serving; `warning` a symptom or an ambiguity to confirm;",
        "`info` something spectrace could not verify.",
        "",
        "| code | severity | cause |",
        "|---|---|---|",
    ]
    for code, entry in CATALOGUE.items():
        lines.append(f"| [`{code}`](#{code}) | {entry.severity} | {_cell(entry.meaning)} |")
    lines += _root_cause_lines()
    lines += _runtime_blind_lines()
    for code, entry in CATALOGUE.items():
        lines += ["", f"## {code}", "", f"**Severity:** {entry.severity}."]
        rule = RULE_BY_CODE.get(code)
        if rule is not None:
            roots = ", ".join(f"`{r}`" for r in rule.roots)
            lines += ["", f"**Follows from** (when present, as an error): {roots}: {rule.how}."]
        for other in sorted(severities[code] - {entry.severity}, key=lambda s: records.SEVERITY_RANK.get(s, 9)):
            when = SEVERITY_WHEN.get((code, other))
            lines.append(f"Raised as **{other}** {when}." if when else f"Also raised as **{other}**.")
        lines += ["", f"**Cause:** {entry.meaning}.", "", f"**Fix:** {entry.fix}."]
        if entry.evidence:
            lines += ["", f"**When it is an error:** {entry.evidence}."]
        keys = evidence[code]
        if keys:
            lines += ["", "**Evidence:**", "", "| key | holds |", "|---|---|"]
            lines += [f"| `{key}` | {_cell(what or '')} |" for key, what in keys.items()]
        else:
            lines += ["", "**Evidence:** none beyond the message."]
    return "\n".join(lines) + "\n"


# Real-world bug classes (issue 43's collection) that no runtime hook observes: what spectrace
# says instead, and the signal a runtime check would need. Kept beside the catalogue so the
# page says where the tool is blind rather than letting silence read as health.
RUNTIME_BLIND: tuple[tuple[str, str, str], ...] = (
    (
        "a draft trained on purpose with another rotary than its target's, its config faithful",
        "`rope_mismatch` (the check assumes the trainers' default: the draft rotates like its target)",
        "the rotary base and scaling the trainer used, written in the checkpoint's training record "
        "(`eagle_config`, speculators' config or `run.yaml`); no trainer records it today",
    ),
    (
        "NeoX vs GPT-J rotary style in TensorRT-LLM (TensorRT-LLM#19036)",
        "nothing: spectrace has no TensorRT-LLM integration",
        "the rotary style and base of the draft's and the target's attention plugins, from TensorRT-LLM's engine config",
    ),
    (
        "a tensor-parallel draft vocabulary shard gathered by global id (sglang#4328)",
        "`vocab_map_invalid` checks the whole map at load; a right map gathered wrongly is seen only as `acceptance_collapse`",
        "each TP rank's vocabulary range beside the hot-map ids its logits gather, or one step's proposed "
        "target ids against a full-vocabulary gather of the same draft logits",
    ),
    (
        "prompts sent without the chat template, the output looping on two tokens",
        "on vLLM, `acceptance_workload` (each finished request's repeated 4-gram rate, read from the scheduler); on SGLang "
        "`acceptance_collapse` or nothing (a looping output can even accept well)",
        "on SGLang, each finished request's output ids (or its repeated n-gram rate) where its scheduler frees it; on both, "
        "a per-request flag from the engine's chat layer saying whether a template was applied",
    ),
    (
        "which state-carrying cause made acceptance drift (prefix-cache blocks committed before their KV was "
        "written, vllm#41838; radix cache, sglang#10846)",
        "`acceptance_drift` names the window and the candidate causes, not which one",
        "per request, the prefix-cache hit length beside its accept length, and the cache's block-commit "
        "events (when a block became reusable against when its KV write finished)",
    ),
    (
        "heads or embeddings replaced after load on vllm-ascend (vllm-ascend#7038), or RoPE on its NPU kernels (vllm-ascend#6612)",
        "nothing at runtime: the hooks patch vLLM's and SGLang's classes, not vllm-ascend's",
        "the same draft-load and first-forward seams on vllm-ascend's draft classes (its model files), where "
        "the fingerprints and rotary modules would be read as on vLLM",
    ),
)


def _runtime_blind_lines() -> list[str]:
    lines = [
        "",
        "## What spectrace cannot see at runtime",
        "",
        "Bug classes from real deployments that no runtime hook of spectrace observes today. Where it",
        "stays silent or names only a consequence, this says so, and which signal a check would need.",
        "",
        "| bug class | what spectrace says instead | signal that would be needed |",
        "|---|---|---|",
    ]
    lines += [f"| {_cell(bug)} | {_cell(says)} | {_cell(needed)} |" for bug, says, needed in RUNTIME_BLIND]
    return lines


def _root_cause_lines() -> list[str]:
    """The root-cause rules (``spectrace.checks.root_causes``) as a table."""
    lines = [
        "",
        "## Root causes and their consequences",
        "",
        "One bug is often seen several times: with aux capture off, the draft gets hidden-size-wide",
        "states (`fc_bypass`) and the target rejects its tokens (`acceptance_collapse`). `spectrace view`",
        "shows each root cause once, with its fix, and its consequences beneath it without a fix of their",
        "own (the root's fix clears them); `--json` gives each finding's `follows_from`, `root`,",
        "`root_fix`, `also_from` (other roots present that explain it as well) and, on a root, its",
        "`consequences`. Only an error finding is a root. A finding that follows from none present",
        "stands alone. The rules:",
        "",
        "| finding | follows from (the most direct first) | why |",
        "|---|---|---|",
    ]
    for rule in RULES:
        roots = ", ".join(f"`{r}`" for r in rule.roots)
        lines.append(f"| `{rule.consequence}` | {roots} | {_cell(rule.how)} |")
    return lines


# ---------------------------------------------------------------------------- trace format

NESTED: tuple[type[BaseModel], ...] = (records.TensorMeta, records.TensorStats)

# Record summaries and field descriptions where the model itself has none (a field's own
# ``description`` wins). tests/docs/test_docs.py reports a field described in neither place.
RECORD_NOTES: dict[str, str] = {
    "Header": "The first line of every trace file: who wrote it, with which settings and versions.",
}
FIELD_NOTES: dict[tuple[str, str], str] = {
    ("TensorStats", "mean"): "mean of the values; null when they hold NaN or Inf, for complex values and for kinds without statistics",
    ("TensorStats", "std"): "standard deviation; null as for `mean`",
    ("TensorStats", "absmax"): "largest absolute value (largest modulus for complex values); null when a NaN is present",
    ("TensorStats", "nan"): "count of NaN values",
    ("TensorStats", "inf"): "count of infinite values",
    ("TensorStats", "numel"): "number of values",
    ("TensorMeta", "shape"): "the tensor's shape (`[]` for a nested tensor)",
    ("TensorMeta", "dtype"): "dtype without the `torch.` prefix: `bfloat16`, `int64`, ...",
    ("TensorMeta", "device"): "`cpu`, `cuda:0`, ...",
    ("TensorMeta", "stats"): "null with `SPECTRACE_STATS=off`, for tensors `basic` does not summarise (it summarises the "
    "first tensor in and out), for index dtypes (token ids never get statistics) and for kinds without them",
    ("Header", "schema_version"): "version of this schema; a viewer older than the file reads what matches and says so",
    ("Header", "spectrace_version"): "the spectrace release that wrote the file",
    ("Header", "pid"): "process id of the writer",
    ("Header", "host"): "host name of the writer",
    ("Header", "rank"): "distributed rank (`SPECTRACE_RANK` or `RANK`), or null",
    ("Header", "argv"): "the command line with every option value replaced by `<redacted>` (in full with `SPECTRACE_KEEP_ARGV=1`)",
    ("Header", "started_unix"): "when tracing started (Unix seconds)",
    ("Header", "settings"): "the spectrace settings in effect (as `spectrace settings` prints them, credentials redacted)",
    ("Header", "versions"): "versions of python, torch, transformers and sglang where loaded",
    ("Call", "step"): "the step: one outermost call of a traced root model",
    ("Call", "module"): "the module's name, prefixed with its root's (`draft.model.fc`)",
    ("Call", "module_type"): "the module's class name",
    ("Call", "root"): "the name the root model was traced under (`target`, `draft`)",
    ("Call", "inputs"): "tensor arguments of the call",
    ("Call", "outputs"): "tensors the call returned",
    ("Call", "t_unix"): "when the call ran (Unix seconds)",
    ("Finding", "code"): "the finding code ([findings.md](findings.md))",
    ("Finding", "severity"): "`error`, `warning` or `info`",
    ("Finding", "message"): "what was seen, with its figures",
    ("Finding", "module"): "the module, checkpoint group or config key it concerns",
    ("Finding", "evidence"): "the figures behind it, per code ([findings.md](findings.md))",
    ("Finding", "fix"): "what to change",
    ("Finding", "step"): "the step it was first seen at, or null for load- and capture-time findings",
    ("Finding", "source"): "the check that raised it (`checks.capture`, `sglang.forward`, ...)",
    ("Acceptance", "step"): "the verify step",
    ("Acceptance", "accept_lengths"): "per request: accepted draft tokens plus the bonus token",
    ("Coverage", "kind"): "`graph_replay`: steps replayed from a CUDA graph, not traced per module; `not_covered`: a "
    "check that could not run (a patch point missing, skipped or a model without hooks); `dropped`: records lost; "
    "`internal_error`, `sink_error`: a failure inside spectrace or a sink, counted; `unhooked`: no module matched",
    ("Coverage", "detail"): "what was not seen, and why",
    ("Coverage", "count"): "how often it happened (said once, then counted)",
    ("Coverage", "step"): "the step it was first seen at, or null",
    ("Weights", "module"): "the model whose weights were loaded (`draft`, ...)",
    ("Weights", "offered"): "tensor names the checkpoint offered",
    ("Weights", "written"): "parameters a loader wrote (a loader ran for them, or their bits changed)",
    ("Weights", "ignored"): "offered names no parameter consumed",
    ("Weights", "missing"): "parameters nothing wrote: they keep their initial values",
    ("Weights", "source"): "the load path observed (`load_weights`, ...)",
    ("Capture", "module"): "the target model",
    ("Capture", "requested_ids"): "the layer ids the target was asked to capture (null: the engine's defaults)",
    ("Capture", "boundaries"): "the boundaries captured, in order",
    ("Capture", "num_layers"): "the target's layer count",
    ("Capture", "hidden_size"): "the target's hidden size",
    ("Capture", "enabled"): "false when the target captures no aux hidden states",
    ("Fingerprint", "module"): "where the fused input was seen (`draft.model.fc`)",
    ("Fingerprint", "chunk_width"): "width of each chunk (the target hidden size)",
    ("Fingerprint", "chunks"): "statistics of each chunk, in order",
    ("Fingerprint", "boundaries"): "the boundaries the chunks come from, where known",
    ("Counters", "steps"): "steps traced",
    ("Counters", "calls_seen"): "module calls seen, those of steps left out by sampling included",
    ("Counters", "records_written"): "records that reached the file",
    ("Counters", "records_dropped"): "records lost to a full buffer or a failing sink",
    ("Counters", "internal_errors"): "failures inside spectrace, caught and counted (the model kept running)",
    ("Counters", "sink_errors"): "failed writes or exports",
    ("Counters", "graph_replay_steps"): "steps that ran as CUDA-graph replays (not traced per module)",
}


def record_models() -> list[type[BaseModel]]:
    """The record types in the order of the ``Record`` union."""
    union = get_args(records.Record)[0]
    return list(get_args(union))


def _anchor(model: type[BaseModel]) -> str:
    return model.__name__.lower()


def _type(tp: Any) -> str:
    if tp is type(None):
        return "null"
    if tp is Any:
        return "any"
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return f"[{tp.__name__}](#{_anchor(tp)})"
    simple = {str: "string", int: "integer", float: "number", bool: "boolean"}
    if tp in simple:
        return simple[tp]
    origin, args = get_origin(tp), get_args(tp)
    if origin is Literal:
        return " or ".join(f'`"{a}"`' for a in args)
    if origin is Union or (hasattr(types, "UnionType") and origin is types.UnionType):
        return " or ".join(_type(a) for a in args)
    if origin is list:
        return f"list of {_type(args[0])}" if args else "list"
    if origin is dict:
        return f"object of {_type(args[1])}" if args else "object"
    if origin is typing.Annotated:
        return _type(args[0])
    return str(tp)


def _default(field: Any) -> str:
    if field.is_required():
        return "required"
    value = field.default_factory() if field.default_factory is not None else field.default
    return f"`{json.dumps(value)}`"


def _doc(model: type[BaseModel]) -> str:
    own = model.__dict__.get("__doc__")
    text = inspect.cleandoc(own) if own else RECORD_NOTES.get(model.__name__, "")
    return " ".join(line.strip() for line in text.splitlines() if line.strip()).replace("``", "`")


def field_description(model: type[BaseModel], name: str) -> str | None:
    field = model.model_fields[name]
    if name == "type" and get_origin(field.annotation) is Literal:
        return f"always `{get_args(field.annotation)[0]}`"
    return field.description or FIELD_NOTES.get((model.__name__, name))


def _model_section(model: type[BaseModel]) -> list[str]:
    fields = model.model_fields
    kind = fields.get("type")
    title = f"`{kind.default}` ({model.__name__})" if kind is not None else model.__name__
    lines = ["", f'<a id="{_anchor(model)}"></a>', f"## {title}", ""]
    doc = _doc(model)
    if doc:
        lines += [doc, ""]
    lines += ["| field | type | default | description |", "|---|---|---|---|"]
    for name, field in fields.items():
        lines.append(
            f"| `{name}` | {_cell(_type(field.annotation))} | {_cell(_default(field))} | {_cell(field_description(model, name) or '')} |"
        )
    return lines


def trace_format_markdown() -> str:
    models = record_models()
    lines = [
        "# Trace format",
        "",
        f"Generated by `{REGENERATE}` from the pydantic models in `spectrace/records.py`; do not",
        "edit by hand.",
        "",
        "A trace is a JSONL file, one JSON object per line, one file per process:",
        "`trace-<host>-<pid>[-rank<r>].jsonl`. The first line is a `header`; the last line of a",
        "trace whose process exited, or whose `trace()` ended, is a `counters` record. A file without",
        "it is shown by `spectrace view` as *not closed* (the process crashed or was killed) or",
        "*open* (it is still running). Each record names its `type`. Floats that are not finite",
        "are written as `null`. A reader keeps the keys it does not know (a newer writer's), and",
        f"reads a file of a newer `schema_version` (now {records.SCHEMA_VERSION}) as far as it matches.",
        "",
        "Calls and acceptance records are appended every `SPECTRACE_FLUSH_SECONDS`; every other",
        "record is written the moment it is recorded, with its time in `t_unix`.",
        "",
        "Records: " + ", ".join(f"[`{m.model_fields['type'].default}`](#{_anchor(m)})" for m in models) + ".",
        "Nested objects: " + ", ".join(f"[{m.__name__}](#{_anchor(m)})" for m in NESTED) + ".",
    ]
    for model in [*models, *NESTED]:
        lines += _model_section(model)
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- entry point

PAGES: dict[str, Callable[[], str]] = {
    "docs/findings.md": findings_markdown,
    "docs/trace-format.md": trace_format_markdown,
}


def stale(root: Path) -> list[str]:
    """Pages under ``root`` that differ from what is generated now."""
    out = []
    for rel, make in PAGES.items():
        path = root / rel
        if not path.is_file() or path.read_text(encoding="utf-8") != make():
            out.append(rel)
    return out


def write(root: Path) -> list[str]:
    """Rewrite the pages under ``root``; returns those that changed."""
    changed = stale(root)
    for rel in changed:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(PAGES[rel](), encoding="utf-8")
    return changed


def undescribed() -> list[str]:
    """Evidence keys and record fields that the pages would leave without a description."""
    out = [f"evidence {code}.{key}" for code, keys in evidence_keys().items() for key, what in keys.items() if not what]
    for model in [*record_models(), *NESTED]:
        out += [f"field {model.__name__}.{name}" for name in model.model_fields if not field_description(model, name)]
    return out


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=REGENERATE, description="rewrite docs/findings.md and docs/trace-format.md")
    parser.add_argument("--root", default=".", help="the repository root (default: the current folder)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a page is stale")
    args = parser.parse_args(list(argv) if argv is not None else None)
    root = Path(args.root)
    if not (root / "pyproject.toml").is_file():
        print(f"{REGENERATE}: {root.resolve()} is not the repository root (no pyproject.toml); use --root", file=sys.stderr)
        return 2
    if args.check:
        old = stale(root)
        for rel in old:
            print(f"stale: {rel} (run {REGENERATE})")
        return 1 if old else 0
    for rel in write(root):
        print(f"wrote {rel}")
    for item in undescribed():
        print(f"{REGENERATE}: no description for {item}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
