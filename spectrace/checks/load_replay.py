"""The engine's ``load_weights`` replayed on a checkpoint's tensor names: what it drops,
what it leaves at init, what it loads at the wrong shape.

Pure functions over facts (:mod:`spectrace.checks.facts`) and the engine models
(:mod:`spectrace.rules.engines`); no file is read here.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..records import Finding
from ..rules.catalogue import finding
from ..rules.conventions import first_sglang_implementing
from ..rules.engines import Dims, Engine, Param, layer_rename_note
from .facts import DraftConfigFile, TargetConfig, TensorInfo
from .shape_causes import WIDTH_KEYS, group_by_config_key

# Checkpoint tensors that only exist for a trainer option, and the flag that makes SGLang's
# draft class create a parameter for them (rules.conventions.SGLANG_DRAFT_FLAGS).
EXTRA_TENSORS = {
    "input_norm.": "speculators' norm_before_fc RMSNorm over cat(h_a, h_b, h_c); {engine} has no such module, so the "
    "draft sees un-normalised fused states. Retrain with norm_before_fc=false or serve with an engine that implements it",
    "fc_norm.": "speculators' fc_norm per-chunk RMSNorms; {engine} has no such modules. Retrain with fc_norm=false "
    "or serve with an engine that implements it",
    "aux_norm_": "the legacy name of the fc_norm per-chunk RMSNorms; {engine} has no such modules. Retrain with "
    "fc_norm=false or serve with an engine that implements it",
    "verifier_": "a training-only copy of target weights; delete it from the checkpoint",
}
EXTRA_TENSOR_FLAGS = {"input_norm.": "norm_before_fc", "fc_norm.": "fc_norm", "aux_norm_": "fc_norm"}
MAX_LISTED = 8
# Dropped tensors are reported one finding per rename (or prefix); past this many
# groups the rest share one finding, so a header of 200,000 unrelated names gives a
# bounded report (every name is still in the evidence).
MAX_DROPPED_FINDINGS = 16
# Missing parameters are reported per decoder layer, whatever the engine calls it.
_LAYER = re.compile(r"^(model\.(?:layers\.\d+|midlayer|additional_layers\.\d+))\.")


def listing(names: Sequence[str]) -> str:
    """At most MAX_LISTED names, then how many more."""
    names = list(names)
    more = f" and {len(names) - MAX_LISTED} more" if len(names) > MAX_LISTED else ""
    return ", ".join(names[:MAX_LISTED]) + more


@dataclass
class LoadReplay:
    """What the engine's load_weights does with each checkpoint name."""

    params: dict[str, Param]
    written: dict[str, set[object]]
    dropped: list[str]
    specials: dict[str, str]
    skipped: list[str]
    shape_errors: list[tuple[str, str, list[int], tuple[int, ...]]]


def replay_load(tensors: dict[str, TensorInfo], engine: Engine, dims: Dims) -> LoadReplay:
    params = engine.params(dims)
    replay = LoadReplay(params, defaultdict(set), [], {}, [], [])
    for name in sorted(tensors):
        route = engine.route(name, params)
        if route.kind == "param" and route.param:
            param = params[route.param]
            if route.shard is not None and param.shards is not None:
                expected = param.shards.get(route.shard, param.shape)
            else:
                expected = param.shape
            # fc's width is judged against what the target delivers, in check_fc_width.
            if route.param != "model.fc.weight" and tuple(tensors[name].shape) != expected:
                replay.shape_errors.append((name, route.param, tensors[name].shape, expected))
            replay.written[route.param].add(route.shard)
        elif route.kind == "special" and route.param:
            replay.specials[name] = route.param
        elif route.kind == "skipped":
            replay.skipped.append(name)
        else:
            replay.dropped.append(name)
    return replay


def _fully_written(param: Param, shards: set[object]) -> bool:
    if param.shards is None:
        return bool(shards)
    return set(param.shards) <= shards


class RenameHints:
    """For a dropped name, the prefix rewrite that turns it into an accepted name: the
    candidate sharing the longest suffix (>= 2 parts, the first such candidate on a tie,
    never the name itself).

    The candidates are indexed by their suffixes once, so each lookup costs the name's
    length, not the number of candidates (a scan of every candidate for every dropped
    name was quadratic in the tensor count)."""

    def __init__(self, candidates: list[str]) -> None:
        # suffix -> the first two distinct candidates ending in it (two: one may be the name itself)
        self._by_suffix: dict[tuple[str, ...], list[str]] = {}
        self._longest = 0
        for cand in candidates:
            cparts = tuple(cand.split("."))
            self._longest = max(self._longest, len(cparts))
            for k in range(2, len(cparts) + 1):
                held = self._by_suffix.setdefault(cparts[-k:], [])
                if len(held) < 2 and cand not in held:
                    held.append(cand)

    def __call__(self, name: str) -> tuple[str, str] | None:
        parts = tuple(name.split("."))
        for k in range(min(len(parts), self._longest), 1, -1):
            for cand in self._by_suffix.get(parts[-k:], ()):
                if cand != name:
                    cparts = cand.split(".")
                    return ".".join(parts[: len(parts) - k]), ".".join(cparts[: len(cparts) - k])
        return None


def check_dropped(replay: LoadReplay, engine: Engine, dims: Dims) -> list[Finding]:
    """Checkpoint tensors no parameter consumes, grouped by the rename that would fix them."""
    if not replay.dropped:
        return []
    label = engine.label
    unwritten = {pname for pname, p in replay.params.items() if not _fully_written(p, replay.written.get(pname, set()))}
    candidates = [
        c for c in engine.checkpoint_names(dims)
        if engine.route(c, replay.params).param in unwritten
    ]  # fmt: skip
    hints = RenameHints(candidates)
    groups: dict[tuple[str, str | None], list[str]] = defaultdict(list)
    for name in replay.dropped:
        hint = hints(name)
        if hint:
            groups[(hint[0], hint[1])].append(name)
        else:
            # Trainer-option tensors (aux_norm_low/mid/high, verifier_*) as one group per option.
            extra = next((p for p in EXTRA_TENSORS if name.startswith(p)), None)
            groups[(extra.rstrip("._") if extra else name.split(".")[0], None)].append(name)
    how = (
        "vLLM raises on them at load, so the server will not start" if engine.unknown_names_raise else f"{label} drops them without a word"
    )
    kept, rest = _bounded_groups(groups)
    out = []
    for (src, dst), names in kept.items():
        if dst is not None:
            old = f"{src}." if src else ""
            new = f"{dst}." if dst else ""
            fix = (
                f"rename {old or '<root>.'}* -> {new or '<root>.'}* in the checkpoint, e.g. "
                f"{{k.replace({old!r}, {new!r}, 1) if k.startswith({old!r}) else k: v for k, v in state_dict.items()}}"
                if old
                else f"rename * -> {new}*: {{{new!r} + k: v for k, v in state_dict.items()}}"
            )
            upgrade = layer_rename_note({src: dst}) if engine.name == "sglang" else None
            if upgrade:
                fix += f"; or {upgrade}"
            message = f"{len(names)} tensor(s) under {old or 'the root'}* match no {label} parameter: {listing(names)}; {how}" + (
                "" if engine.unknown_names_raise else " and the parameters they were meant for keep their random init"
            )
            evidence: dict[str, Any] = {"tensors": names, "rename": {"from": old, "to": new}}
        else:
            prefix = next((p for p in EXTRA_TENSORS if names[0].startswith(p)), None)
            fix = _extra_fix(prefix, engine) if prefix else f"map these names to {engine.draft_class} parameters or delete them"
            message = f"{len(names)} tensor(s) match no {label} parameter: {listing(names)}; {how}"
            evidence = {"tensors": names}
        out.append(finding("weights_dropped", message, module=src or None, evidence=evidence, fix=fix))
    if rest:
        names = [name for group in rest.values() for name in group]
        out.append(
            finding(
                "weights_dropped",
                f"{len(names)} more tensor(s), in {len(rest)} other groups, match no {label} parameter: {listing(names)}; {how}",
                evidence={"tensors": names},
                fix=f"map these names to {engine.draft_class} parameters or delete them",
            )
        )
    return out


def _bounded_groups(
    groups: dict[tuple[str, str | None], list[str]],
) -> tuple[dict[tuple[str, str | None], list[str]], dict[tuple[str, str | None], list[str]]]:
    """At most MAX_DROPPED_FINDINGS - 1 groups keep a finding each (renames first, then the
    largest); the rest are returned to share one."""
    if len(groups) <= MAX_DROPPED_FINDINGS:
        return dict(groups), {}
    order = sorted(groups, key=lambda key: (key[1] is None, -len(groups[key])))
    keep = set(order[: MAX_DROPPED_FINDINGS - 1])
    return {k: v for k, v in groups.items() if k in keep}, {k: v for k, v in groups.items() if k not in keep}


def _extra_fix(prefix: str, engine: Engine) -> str:
    """Why a trainer-option tensor matches no parameter of this engine, and what to do."""
    label = engine.label
    flag = EXTRA_TENSOR_FLAGS.get(prefix)
    row = engine.draft_flag(flag) if flag else None
    if row is None:
        return EXTRA_TENSORS[prefix].format(engine=label)
    made = ", ".join(p.replace("{i}", "i") for p in row.params)
    keys = " or ".join(row.keys)
    if row.support == "implemented":
        return (
            f"{label} creates {made} only when {keys} is true and the config does not set it: set {flag}=true "
            f"in config.json if the draft was trained with it, otherwise delete these tensors ({row.how})"
        )
    assert flag is not None  # a row exists only for a known flag
    if row.support == "ignored":
        since = first_sglang_implementing(flag)
        newer = f"serve with SGLang {since} or newer, which implements it, or " if since else ""
        return f"{label} never creates {made} ({row.how}): {newer}retrain with {flag}=false"
    since = first_sglang_implementing(flag)
    return f"{label}'s draft class was not read, so whether it creates {made} is not known ({row.how})" + (
        f"; SGLang {since} and later create it when {keys} is true" if since else ""
    )


def _flag_missing(flag: str, names: list[str], engine: Engine) -> Finding:
    """A parameter the engine creates for a training flag the config sets, with no tensor for it."""
    label = engine.label
    tensors = [n.removeprefix("model.") for n in names]
    module = names[0].removesuffix(".weight")
    module = module.rsplit(".", 1)[0] if module.rsplit(".", 1)[-1].isdigit() else module
    return finding(
        "weights_missing",
        f"the config sets {flag}=true, so {label} creates {listing(names)}, but the checkpoint has no "
        f"{listing(tensors)}: {'it stays' if len(names) == 1 else 'they stay'} at init (an RMSNorm's is all ones), "
        "not the scale the draft was trained with",
        module=module,
        evidence={"parameters": names},
        fix=f"add the trained {listing(tensors)} to the checkpoint, or set {flag}=false if the draft was not trained with it",
    )


def check_missing(replay: LoadReplay, cfg: DraftConfigFile, engine: Engine, target: TargetConfig | None) -> list[Finding]:
    """Parameters nothing writes (lm_head, d2t, decoder layer, ...), minus those the engine fills itself."""
    label = engine.label
    missing: dict[str, list[str]] = defaultdict(list)
    by_flag: dict[str, list[str]] = defaultdict(list)
    for pname, param in replay.params.items():
        if param.optional or _fully_written(param, replay.written.get(pname, set())):
            continue
        if param.flag:
            by_flag[param.flag].append(pname)
            continue
        layer = _LAYER.match(pname)
        group = layer.group(1) if layer else pname.rsplit(".", 1)[0]
        missing[group].append(pname)
    out = [_flag_missing(flag, names, engine) for flag, names in by_flag.items()]
    for group, names in missing.items():
        if group == "lm_head":
            message = (
                f"lm_head.weight is not in the checkpoint but the config sets draft_vocab_size={cfg.draft_vocab_size}, "
                f"so {label} builds the draft's own {cfg.draft_vocab_size}-row head and leaves it at random init "
                "(accept length ~1)"
            )
            fix = "add the trained lm_head.weight, or drop draft_vocab_size so the engine takes the target's head"
        else:
            message = f"{len(names)} parameter(s) of {group} receive no checkpoint tensor and stay at random init: {listing(names)}"
            fix = "add the missing tensors under the names the engine expects (see weights_dropped for a rename)"
        out.append(finding("weights_missing", message, module=group, evidence={"parameters": names}, fix=fix))
    target_vocab = target.vocab_size if target and target.vocab_size else cfg.vocab_size
    if cfg.draft_vocab_size is not None and cfg.draft_vocab_size < target_vocab and not replay.specials:
        where = "hot_token_id" if engine.name == "sglang" else "draft_id_to_target_id"
        out.append(
            finding(
                "weights_missing",
                f"d2t is not in the checkpoint but draft_vocab_size={cfg.draft_vocab_size} < target vocab {target_vocab}: "
                f"{label} has no {where}, so draft token i is proposed as target token i",
                module="d2t",
                evidence={"parameters": ["d2t"], "draft_vocab_size": cfg.draft_vocab_size, "target_vocab": target_vocab},
                fix="save the trainer's d2t (int64, draft_vocab_size entries: target_id - draft_id) with the checkpoint",
            )
        )
    return out


def check_tensor_shapes(replay: LoadReplay, engine: Engine, cfg: DraftConfigFile | None = None) -> list[Finding]:
    """A finding per tensor that does not fit its engine parameter; misfits that one config
    key explains (``hidden_size`` 128 over 64-wide weights) are one finding naming it."""
    out = []
    errors = list(replay.shape_errors)
    if cfg is not None:
        values = {key: getattr(cfg, key, None) for key in WIDTH_KEYS}
        groups, errors = group_by_config_key(errors, values)
        for (key, value, weights), misfits in groups:
            names = [name for name, *_ in misfits]
            out.append(
                finding(
                    "shape_mismatch",
                    f"config.json's {key} is {value} but the weights are {weights} wide: {len(names)} tensors do not "
                    f"fit what {engine.label} builds from it: {listing(names)}",
                    module="config.json",
                    evidence={
                        "config_key": key,
                        "config_value": value,
                        "weights_value": weights,
                        "misfits": {name: {"shape": got, "expected": list(want)} for name, _p, got, want in misfits},
                    },
                    fix=f"set {key} to {weights} in the draft's config.json (what its weights were trained with), "
                    "or ship the weights that config describes",
                )
            )
    for name, pname, got, want in errors:
        out.append(
            finding(
                "shape_mismatch",
                f"{name} has shape {got} but {engine.label} loads it into {pname} as {list(want)}",
                module=pname.rsplit(".", 1)[0],
                evidence={"tensor": name, "shape": got, "expected": list(want)},
                fix="make the draft config (hidden_size, heads, head_dim, intermediate_size, vocab sizes) "
                "describe the checkpoint it ships with",
            )
        )
    return out
