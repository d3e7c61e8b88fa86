"""The pre-launch checks: config + tensor names/shapes [+ target config] -> findings.

Pure functions, no I/O: each check replays what the engine will do with this draft
(name mapping, id convention, flags it reads) and reports where that differs from what
the trainer did. Layer positions are reported as canonical boundaries
(b = Hugging Face ``hidden_states[b]``, 0 = embedding output).

    >>> ckpt = read_checkpoint(Path("tests/fixtures/specforge_tiny"))
    >>> [f.code for f in audit(ckpt.config, ckpt.tensors, get_engine("sglang"), None).findings]
    ['aux_layers_mismatch']
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..audit.checkpoint import DraftConfigFile, TargetConfig, TensorInfo, VocabMaps
from ..audit.engines import Dims, Engine, Param, dims_of
from ..records import SEVERITY_RANK, Capture, Finding
from ..rules.catalogue import finding
from ..rules.conventions import (
    SGLangDraftFlag,
    default_ids,
    engine_boundaries,
    first_sglang_implementing,
    sglang_capture_facts,
    sglang_flag_applies,
)
from ..rules.readings import IDS_KEY, Reading
from ..rules.readings import trained_readings as shared_readings
from .capture import aux_ids_fix, check_engine_support, ids_for_boundaries
from .draft_class import check_draft_class
from .rope import check_rope, effective_rotary
from .vocab_map import check_vocab_map

# Names the trainers use for the same aux-id list, for messages.
TRAINER_MEANING = {
    "speculators": "speculators ids (id k = boundary k, 0 = embeddings)",
    "specforge": "SpecForge ids (id k = output of block k = boundary k+1)",
}
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


@dataclass
class AuditResult:
    findings: list[Finding]
    summary: dict[str, Any] = field(default_factory=dict)


def _engine_label(engine: Engine) -> str:
    return engine.label


def _listing(names: Sequence[str]) -> str:
    names = list(names)
    more = f" and {len(names) - MAX_LISTED} more" if len(names) > MAX_LISTED else ""
    return ", ".join(names[:MAX_LISTED]) + more


# ---------------------------------------------------------------- weights


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
    label = _engine_label(engine)
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
            message = f"{len(names)} tensor(s) under {old or 'the root'}* match no {label} parameter: {_listing(names)}; {how}" + (
                "" if engine.unknown_names_raise else " and the parameters they were meant for keep their random init"
            )
            evidence: dict[str, Any] = {"tensors": names, "rename": {"from": old, "to": new}}
        else:
            prefix = next((p for p in EXTRA_TENSORS if names[0].startswith(p)), None)
            fix = _extra_fix(prefix, engine) if prefix else f"map these names to {engine.draft_class} parameters or delete them"
            message = f"{len(names)} tensor(s) match no {label} parameter: {_listing(names)}; {how}"
            evidence = {"tensors": names}
        out.append(finding("weights_dropped", message, module=src or None, evidence=evidence, fix=fix))
    if rest:
        names = [name for group in rest.values() for name in group]
        out.append(
            finding(
                "weights_dropped",
                f"{len(names)} more tensor(s), in {len(rest)} other groups, match no {label} parameter: {_listing(names)}; {how}",
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
    label = _engine_label(engine)
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
    label = _engine_label(engine)
    tensors = [n.removeprefix("model.") for n in names]
    module = names[0].removesuffix(".weight")
    module = module.rsplit(".", 1)[0] if module.rsplit(".", 1)[-1].isdigit() else module
    return finding(
        "weights_missing",
        f"the config sets {flag}=true, so {label} creates {_listing(names)}, but the checkpoint has no "
        f"{_listing(tensors)}: {'it stays' if len(names) == 1 else 'they stay'} at init (an RMSNorm's is all ones), "
        "not the scale the draft was trained with",
        module=module,
        evidence={"parameters": names},
        fix=f"add the trained {_listing(tensors)} to the checkpoint, or set {flag}=false if the draft was not trained with it",
    )


def check_missing(replay: LoadReplay, cfg: DraftConfigFile, engine: Engine, target: TargetConfig | None) -> list[Finding]:
    """Parameters nothing writes (lm_head, d2t, decoder layer, ...), minus those the engine fills itself."""
    label = _engine_label(engine)
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
            message = f"{len(names)} parameter(s) of {group} receive no checkpoint tensor and stay at random init: {_listing(names)}"
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


def check_tensor_shapes(replay: LoadReplay, engine: Engine) -> list[Finding]:
    out = []
    for name, pname, got, want in replay.shape_errors:
        out.append(
            finding(
                "shape_mismatch",
                f"{name} has shape {got} but {_engine_label(engine)} loads it into {pname} as {list(want)}",
                module=pname.rsplit(".", 1)[0],
                evidence={"tensor": name, "shape": got, "expected": list(want)},
                fix="make the draft config (hidden_size, heads, head_dim, intermediate_size, vocab sizes) "
                "describe the checkpoint it ships with",
            )
        )
    return out


# ---------------------------------------------------------------- aux layers


@dataclass(frozen=True)
class EngineCapture:
    ids: list[int] | None
    source: str
    rule: str
    boundaries: list[int] | None  # None: defaults on an unknown layer count
    dropped_ids: list[int]
    error: str | None
    releases: str = ""  # the engine releases this rule holds for, in words ("SGLang >= 0.5.22")

    @property
    def rule_named(self) -> str:
        """The rule with the releases it applies to: what a fix quotes."""
        return f"the {self.rule} rule" + (f" of {self.releases}" if self.releases else "")


def _sglang_defaults(n: int) -> list[int]:
    # set_eagle3_layers_to_capture(None) stores these as layers_to_capture directly: no +1.
    wanted = set(default_ids("sglang", n))
    return [b for b in range(n) if b in wanted]


def engine_capture(cfg: DraftConfigFile, engine: Engine, target: TargetConfig | None) -> EngineCapture:
    """Which ids the engine reads from this config and the boundaries its target then captures."""
    ids, source = None, ""
    for src in engine.ids_sources:
        value = cfg.top_level_ids if src == "top_level" else cfg.eagle_config_ids
        if value:
            ids, source = value, ("top-level " if src == "top_level" else "eagle_config.") + IDS_KEY
            break
    arch = (target.architectures[0] if target and target.architectures else "") or (target.model_type if target else "")
    rule = engine.capture_rule(arch)
    releases = _rule_releases(engine, arch)
    n = target.num_hidden_layers if target else None
    if ids is None:
        return EngineCapture(None, "defaults [2, n//2, n-3]", rule, _sglang_defaults(n) if n else None, [], None, releases)
    # Without a target the layer count only decides what is dropped: assume enough layers.
    res = engine_boundaries(ids, rule, n if n else max(ids) + 2)
    return EngineCapture(ids, source, rule, res.boundaries, res.dropped_ids if n else [], res.error if n else None, releases)


def _rule_releases(engine: Engine, arch: str) -> str:
    """The SGLang releases whose capture facts for this target are the ones applied (``SGLANG_CAPTURE``)."""
    if engine.name != "sglang":
        return ""
    facts = sglang_capture_facts(arch or "LlamaForCausalLM", "0.5.0" if engine.version == "older" else engine.version)
    return f"SGLang {facts.span}" if facts is not None else ""


def trained_readings(cfg: DraftConfigFile, n: int | None) -> list[Reading]:
    """The boundaries the draft was trained on, most likely first (the runtime's rule)."""
    found = shared_readings(
        stated=cfg.stated,
        top_level_ids=cfg.top_level_ids,
        eagle_config_ids=cfg.eagle_config_ids,
        speculators_hints=bool(cfg.speculators_traces),
        num_layers=n,
    )
    # A known trainer leaves one reading: the ambiguity warning becomes an error or nothing.
    known = [r for r in found if cfg.trained_with is not None and r.convention == cfg.trained_with]
    return known[:1] or found


def _describe(reading: Reading) -> str:
    if reading.ids is None:
        return f"the trainer's default boundaries {reading.boundaries}"
    if reading.convention not in TRAINER_MEANING:  # stated in config.json, no convention named
        return f"boundaries {reading.boundaries}, as config.json states"
    return f"{reading.ids} read as {TRAINER_MEANING[reading.convention]} = boundaries {reading.boundaries}"


def check_aux_layers(cfg: DraftConfigFile, engine: Engine, target: TargetConfig | None) -> list[Finding]:
    """Trained boundaries versus captured ones, under every plausible reading of the ids."""
    label = _engine_label(engine)
    n = target.num_hidden_layers if target else None
    cap = engine_capture(cfg, engine, target)
    readings = trained_readings(cfg, n)
    out: list[Finding] = []
    ignored_top = bool(cfg.top_level_ids) and "top_level" not in engine.ids_sources
    engine_says = (
        f"{label} reads {cap.source} {cap.ids} and its target ({cap.rule} rule) captures boundaries {cap.boundaries}"
        if cap.ids is not None
        else f"{label} finds no ids in eagle_config, so its target captures its defaults [2, n//2, n-3]"
        + (f" = boundaries {cap.boundaries} (n={n})" if cap.boundaries is not None else "")
    )
    if ignored_top:
        fix_ids = ids_for_boundaries(readings[0].boundaries, cap.rule, n or max(readings[0].boundaries) + 2) if readings else None
        out.append(
            finding(
                "unsupported_config_flag",
                f"top-level {IDS_KEY} {cfg.top_level_ids} is ignored by {label}, which reads eagle_config only"
                + ("" if n else "; pass --target-config to see which layers the target captures instead"),
                module="config.json",
                evidence={"top_level_ids": cfg.top_level_ids, "eagle_config_ids": cfg.eagle_config_ids},
                fix=f"put the ids in eagle_config.{IDS_KEY}" + (f" as {fix_ids} ({cap.rule_named})" if fix_ids is not None else ""),
            )
        )
    if cap.boundaries is None or not readings:
        return out
    matches = {r.convention: r.boundaries == cap.boundaries for r in readings}
    primary, others = readings[0], readings[1:]
    bad_alt = [r for r in others if not matches[r.convention]]
    if matches[primary.convention] and not bad_alt:
        return out
    if primary.ids is None and cap.ids is None and sorted(set(primary.boundaries)) == cap.boundaries:
        # Trainer and engine took the same defaults; the engine only collapsed a layer the
        # defaults name twice on a shallow target. One cause, reported once: short_capture.
        return out
    n_eff = n or max(max(primary.boundaries), max(cap.boundaries)) + 2
    fix_ids, fix = aux_ids_fix(primary.boundaries, cap.rule, n_eff, cap.rule_named)
    evidence: dict[str, Any] = {
        "engine_ids": cap.ids,
        "engine_ids_source": cap.source,
        "engine_rule": cap.rule,
        "engine_boundaries": cap.boundaries,
        "fix_ids": fix_ids,
        "readings": {r.convention: {"ids": r.ids, "boundaries": r.boundaries, "source": r.source} for r in readings},
        "target_layers": n,
    }
    tail = (
        " The widths match, so nothing fails loudly: only acceptance drops."
        if len(cap.boundaries) == len(primary.boundaries)
        else " See short_capture for the width."
    )
    if not matches[primary.convention]:
        alt = "".join(
            f" Read as {TRAINER_MEANING[r.convention]} they mean boundaries {r.boundaries}"
            + (", which the engine does capture." if matches[r.convention] else ", also not captured.")
            for r in others
        )
        message = f"trained on {_describe(primary)} ({primary.source}), but {engine_says}.{alt}{tail}"
        out.append(finding("aux_layers_mismatch", message, module="config.json", evidence=evidence, fix=fix))
    else:
        other = bad_alt[0]
        message = (
            f"the ids are ambiguous: {_describe(primary)} matches what {label} captures ({cap.boundaries}), but if "
            f"they were written for the other trainer ({_describe(other)}), the engine captures {cap.boundaries} "
            f"instead of {other.boundaries}. Check which trainer produced eagle_config.{IDS_KEY}."
        )
        alt_fix = ids_for_boundaries(other.boundaries, cap.rule, n_eff)
        out.append(
            finding(
                "aux_layers_mismatch",
                message,
                severity="warning",
                module="config.json",
                evidence=evidence,
                fix=(
                    f"if the draft was trained by {other.convention}, set eagle_config.{IDS_KEY} to {alt_fix}"
                    if alt_fix is not None
                    else fix
                ),
            )
        )
    return out


def check_short_capture(cfg: DraftConfigFile, engine: Engine, target: TargetConfig | None) -> list[Finding]:
    """Ids at or past the target's layer count (or colliding defaults) capture fewer chunks than trained."""
    if target is None:
        return []
    n = target.num_hidden_layers
    cap = engine_capture(cfg, engine, target)
    readings = trained_readings(cfg, n)
    want = len(readings[0].boundaries) if readings else 3
    out = []
    if cap.boundaries is not None and (len(cap.boundaries) < want or cap.dropped_ids):
        label = _engine_label(engine)
        wide = f"the fused input is {len(cap.boundaries)} x hidden wide instead of {want} x hidden"
        evidence: dict[str, Any] = {"target_layers": n, "engine_ids": cap.ids, "engine_boundaries": cap.boundaries, "wanted": want}
        if cap.ids is None:
            # No ids anywhere the engine reads: its defaults name the same layer twice on a
            # target this shallow. No id was dropped, and none can be "moved below n".
            defaults = default_ids("sglang", n)
            message = (
                f"the target has {n} layers and {label} finds no ids in eagle_config, so it captures its defaults "
                f"[2, n//2, n-3] = {defaults}: only {len(cap.boundaries)} distinct boundaries {cap.boundaries} of {want}, "
                f"the same layer named twice on so shallow a target; {cap.error or wide}"
            )
            fix = (
                f"set eagle_config.{IDS_KEY} to the {want} distinct layers below {n} the draft was trained on, "
                "or serve it with the deeper target it was trained for"
            )
        elif cap.dropped_ids:
            message = (
                f"the target has {n} layers; {cap.source} {cap.ids} captures only {len(cap.boundaries)} distinct "
                f"boundaries {cap.boundaries} of {want}: ids {cap.dropped_ids} are past its last layer; "
                + (cap.error or f"{label}'s capture loop never reaches them and drops them silently; {wide}")
            )
            evidence["dropped_ids"] = cap.dropped_ids
            fix = "use layer ids below the target's layer count; the engine drops the others without a word"
        else:
            message = (
                f"the target has {n} layers; {cap.source} {cap.ids} names only {len(cap.boundaries)} distinct "
                f"boundaries {cap.boundaries} of {want}: {cap.error or wide}"
            )
            fix = f"give {want} distinct ids in eagle_config.{IDS_KEY}, below the target's layer count {n}"
        out.append(finding("short_capture", message, module="config.json", evidence=evidence, fix=fix))
    for r in readings[:1]:
        beyond = [b for b in r.boundaries if b > n]
        if beyond:
            out.append(
                finding(
                    "short_capture",
                    f"the draft was trained on boundaries {r.boundaries} but the target has only {n} layers "
                    f"(boundaries 0..{n}): {beyond} do not exist on this target; was the draft trained for another one?",
                    module="config.json",
                    evidence={"target_layers": n, "trained_boundaries": r.boundaries},
                )
            )
    return out


def check_capture_support(cfg: DraftConfigFile, engine: Engine, target: TargetConfig | None) -> list[Finding]:
    """Will this SGLang release crash on the capture list? The runtime check's table and finding.

    The capture the engine would make (ids it reads, its rule, the target's layer count) goes
    through ``checks.capture.check_engine_support``, the function the runtime join calls at
    ``set_eagle3_layers_to_capture``, so ``--engine sglang==V`` says what a live V would.
    Without --target-config the target is taken to be a Llama (the audit's default rule).
    """
    if engine.name != "sglang" or engine.version == "older":
        return []
    cap = engine_capture(cfg, engine, target)
    if cap.boundaries is None:
        return []
    arch = (target.architectures[0] if target and target.architectures else "") or (target.model_type if target else "")
    n = target.num_hidden_layers if target else 0
    capture = Capture(
        module="target", requested_ids=cap.ids, boundaries=cap.boundaries, num_layers=n,
        hidden_size=target.hidden_size if target else 0, rule=cap.rule,
    )  # fmt: skip
    found = check_engine_support(capture, engine.version, target_class=arch or "LlamaForCausalLM")
    for f in found:
        if not arch:
            f.evidence["target_class_assumed"] = "no --target-config: a Llama target assumed"
    return found


# ---------------------------------------------------------------- widths, switches, flags


def check_fc_width(cfg: DraftConfigFile, tensors: dict[str, TensorInfo], engine: Engine, target: TargetConfig | None) -> list[Finding]:
    """fc.in_features against num_aux x target hidden (what the target delivers and what the engine builds)."""
    out: list[Finding] = []
    label = _engine_label(engine)
    cfg_target_hidden = cfg.target_hidden_size or cfg.hidden_size
    if target is not None and target.hidden_size != cfg_target_hidden:
        key = "target_hidden_size" if cfg.target_hidden_size else "hidden_size (no target_hidden_size)"
        out.append(
            finding(
                "shape_mismatch",
                f"the draft config's {key} is {cfg_target_hidden} but the target's hidden_size is {target.hidden_size}",
                module="config.json",
                evidence={"draft_target_hidden": cfg_target_hidden, "target_hidden": target.hidden_size},
                fix=f"set target_hidden_size={target.hidden_size} in the draft config (or audit against the right target)",
            )
        )
    name = next((k for k in ("fc.weight", "model.fc.weight") if k in tensors), None)
    if name is None or len(tensors[name].shape) != 2:
        return out
    fc_in = tensors[name].shape[1]
    hidden = target.hidden_size if target else cfg_target_hidden
    cap = engine_capture(cfg, engine, target)
    delivered = len(cap.boundaries) if cap.boundaries is not None else 3
    built_aux = engine.fc_aux(dims_of(cfg))
    built = built_aux * cfg_target_hidden
    problems = []
    if fc_in != delivered * hidden:
        problems.append(f"the target delivers {delivered} x {hidden} = {delivered * hidden}")
    if fc_in != built:
        problems.append(f"{label} builds fc for {built_aux} x {cfg_target_hidden} = {built}")
    if problems:
        why = (
            " A fused input as wide as the draft's hidden size skips fc silently (fc bypass)."
            if delivered * hidden == cfg.hidden_size
            else ""
        )
        out.append(
            finding(
                "shape_mismatch",
                f"fc.weight takes {fc_in} input features, but " + " and ".join(problems) + "." + why,
                module="model.fc",
                evidence={
                    "fc_in_features": fc_in,
                    "delivered": delivered * hidden,
                    "engine_fc_in": built,
                    "num_aux": delivered,
                    "target_hidden": hidden,
                },  # fmt: skip
            )
        )
    return out


def check_null_keys(cfg: DraftConfigFile, engine: Engine) -> list[Finding]:
    """A key written as null that the engine reads as a value: the draft fails to build."""
    if engine.name != "sglang" or "target_hidden_size" not in cfg.null_keys:
        return []
    return [
        finding(
            "shape_mismatch",
            f"config.json sets target_hidden_size to null: {_engine_label(engine)}'s draft class takes it as fc's input "
            "size whenever the key exists (hasattr(config, 'target_hidden_size')), so building fc fails "
            "(TypeError on None x num_aux) before the server serves",
            module="config.json",
            evidence={"target_hidden_size": None, "hidden_size": cfg.hidden_size},
            fix="set target_hidden_size to the target's hidden size, or delete the key (the draft's hidden_size is then used)",
        )
    ]


def check_aux_enabled(cfg: DraftConfigFile, engine: Engine) -> list[Finding]:
    if cfg.use_aux_hidden_state is not False:
        return []
    return [
        finding(
            "aux_capture_disabled",
            "eagle_config.use_aux_hidden_state is false: the target captures no aux hidden states and "
            + (
                "the draft gets the final hidden state, fc is skipped (fc bypass)"
                if engine.name == "sglang"
                else "vLLM builds the draft without fc"
            ),
            module="config.json",
            evidence={"use_aux_hidden_state": False},
            fix="set eagle_config.use_aux_hidden_state=true (and launch with --speculative-algorithm EAGLE3)",
        )
    ]


VLLM_UNVERIFIED_FLAGS = ("fc_norm", "norm_output")


def _sglang_flag(flag: str, row: SGLangDraftFlag, cfg: DraftConfigFile, engine: Engine) -> Finding | None:
    """The finding for a flag the config sets, as this release's draft class treats it (None: honoured)."""
    label = _engine_label(engine)
    if row.support == "implemented":
        return None
    head_from_target = cfg.draft_vocab_size is None and not cfg.tie_word_embeddings
    if row.support == "ignored" and not sglang_flag_applies(
        row, cfg.hidden_size, cfg.target_hidden_size, head_from_target=head_from_target
    ):
        return None
    evidence: dict[str, Any] = {
        flag: True, "engine": "sglang", "engine_version": engine.version, "releases": row.span,
        "read_in": list(row.read_in),
    }  # fmt: skip
    since = first_sglang_implementing(flag)
    if row.support == "unknown":
        return finding(
            "unsupported_config_flag",
            f"{flag}=true: {label}'s draft class was not read, so whether it implements the flag is not known "
            f"({row.how}). If it ignores it: {row.effect}",
            severity="warning",
            module="config.json",
            evidence=evidence,
            fix=(f"serve with SGLang {since} or newer, which implements it" if since
                 else f"check that release's models/llama_eagle3.py for {flag}, or retrain with {flag}=false"),
        )  # fmt: skip
    unread = "" if row.read(engine.version) else (
        f"; {engine.version} itself was not read, the rule is that of the releases read in {row.span}"
    )  # fmt: skip
    return finding(
        "unsupported_config_flag",
        f"{flag}=true is ignored by {label}: {row.effect} ({row.how}{unread})",
        severity=row.severity,  # type: ignore[arg-type]
        module="config.json",
        evidence=evidence,
        fix=f"retrain with {flag}=false, or serve with "
        + (f"SGLang {since} or newer, which implements it" if since else "an engine that implements it")
        + " (vLLM reads norm_before_residual and norm_before_fc)",
    )


def check_flags(cfg: DraftConfigFile, engine: Engine) -> list[Finding]:
    """Training flags the config sets that this engine release does not implement."""
    out = []
    for flag, value in cfg.flags.items():
        if not value:
            continue
        row = engine.draft_flag(flag)
        if row is not None:
            found = _sglang_flag(flag, row, cfg, engine)
            if found is not None:
                out.append(found)
        elif engine.name == "vllm" and flag in VLLM_UNVERIFIED_FLAGS:
            out.append(
                finding(
                    "unsupported_config_flag",
                    f"{flag}=true: spectrace has not verified that vLLM implements it",
                    severity="info",
                    module="config.json",
                    evidence={flag: True},
                    fix=f"check vLLM's llama_eagle3.py for {flag} before relying on it",
                )
            )
    return out


# ---------------------------------------------------------------- all together


def check_rotary(cfg: DraftConfigFile, engine: Engine, target: TargetConfig | None) -> list[Finding]:
    """The draft's rotary embedding against the target's, each read as the engine reads it."""
    return check_rope(cfg.rope, target.rope if target else None, engine=engine.name, label=_engine_label(engine))


def check_maps(cfg: DraftConfigFile, tensors: dict[str, TensorInfo], maps: VocabMaps | None, target: TargetConfig | None) -> list[Finding]:
    """The checkpoint's d2t/t2d by value (when read) against the draft and target vocabularies."""
    if maps is None:
        return []
    name = next((n for n in sorted(tensors) if n.rsplit(".", 1)[-1] == "d2t"), "d2t")
    target_vocab = target.vocab_size if target and target.vocab_size else cfg.vocab_size
    return check_vocab_map(maps.d2t, maps.t2d, draft_vocab_size=cfg.draft_vocab_size, target_vocab=target_vocab, module=name)


def rotary_summary(cfg: DraftConfigFile, engine: Engine, target: TargetConfig | None) -> dict[str, Any]:
    out: dict[str, Any] = {"draft": effective_rotary(cfg.rope, engine=engine.name).summary()}
    if target is not None and target.rope is not None:
        out["target"] = effective_rotary(target.rope, one_rotary=False, engine=engine.name).summary()
    return out


def audit(
    cfg: DraftConfigFile,
    tensors: dict[str, TensorInfo],
    engine: Engine,
    target: TargetConfig | None = None,
    maps: VocabMaps | None = None,
) -> AuditResult:
    """Every check, findings sorted by severity, plus the replay summary.

    ``maps``: the values of the checkpoint's d2t/t2d (``read_vocab_maps``); without them the
    maps are checked by name and shape only."""
    if engine.name == "vllm" and engine.version != "recent":  # a vLLM release read from its source
        from .vllm_audit import audit_vllm

        return audit_vllm(cfg, tensors, engine, target, maps)
    dims = dims_of(cfg)
    replay = replay_load(tensors, engine, dims)
    findings: list[Finding] = []
    findings += check_dropped(replay, engine, dims)
    findings += check_missing(replay, cfg, engine, target)
    findings += check_tensor_shapes(replay, engine)
    findings += check_null_keys(cfg, engine)
    findings += check_fc_width(cfg, tensors, engine, target)
    findings += check_aux_enabled(cfg, engine)
    if engine.name == "sglang":
        has_ids = bool(cfg.top_level_ids or cfg.eagle_config_ids)
        findings += check_draft_class(cfg.architectures, tensors, has_ids)
    findings += check_aux_layers(cfg, engine, target)
    findings += check_short_capture(cfg, engine, target)
    findings += check_capture_support(cfg, engine, target)
    findings += check_flags(cfg, engine)
    findings += check_rotary(cfg, engine, target)
    findings += check_maps(cfg, tensors, maps, target)
    for f in findings:
        f.source = "audit"
    findings.sort(key=lambda f: SEVERITY_RANK[f.severity])
    n = target.num_hidden_layers if target else None
    cap = engine_capture(cfg, engine, target)
    not_loaded = {*replay.dropped, *replay.specials, *replay.skipped}  # a set: one lookup per tensor
    summary = {
        "engine": {
            "name": engine.name,
            "version": engine.version,
            "spec": engine.spec,
            "draft_class": engine.draft_class,
            "assumptions": engine.assumptions_for(cfg),
        },  # fmt: skip
        "trained_readings": [
            {"trainer": r.convention, "ids": r.ids, "boundaries": r.boundaries, "source": r.source} for r in trained_readings(cfg, n)
        ],
        "engine_capture": {
            "ids": cap.ids,
            "source": cap.source,
            "rule": cap.rule,
            "rule_releases": cap.releases,
            "boundaries": cap.boundaries,
        },  # fmt: skip
        "rotary": rotary_summary(cfg, engine, target),
        "vocab_maps": {
            "d2t_entries": len(maps.d2t) if maps and maps.d2t is not None else None,
            "t2d_entries": len(maps.t2d) if maps and maps.t2d is not None else None,
            "notes": list(maps.notes) if maps else ["values not read"],
        },
        "weights": {
            "loaded": sorted(name for name in tensors if name not in not_loaded),
            "dropped": replay.dropped,
            "special": replay.specials,
            "skipped": replay.skipped,
        },
    }
    return AuditResult(findings, summary)
