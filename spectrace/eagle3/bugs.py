"""Named wiring bugs on the trained tiny pair: each builds the engine the way the bug leaves it.

Every scenario serves the same trained draft (trained, SpecForge-style, on
``cat(hs[0], hs[2], hs[4])``) through an SGLang-like engine; only the config, checkpoint,
algorithm or loader version changes, exactly where the field saw each bug. Nothing in
the build warns: finding the cause is the tracer's job.

    >>> scenario = build_scenario("fc_bypass")
    >>> scenario.target.aux_enabled, scenario.algorithm
    (False, 'EAGLE3')
    >>> round(scenario.run(), 2) < round(build_scenario("healthy").run(), 2)
    True
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..rules.conventions import trainer_boundaries
from .draft import DraftConfig, Eagle3Draft
from .loop import mean_accept_length
from .pair import (
    DATA_DIR,
    as_loadable,
    demo_max_new_tokens,
    demo_prompts,
    load_draft_checkpoint,
    load_target_model,
    speculators_checkpoint,
)
from .target import Eagle3Target

ENGINE_CONVENTION = "sglang_llama"  # the shipped target is a Llama: SGLang's always-+1 rule


@dataclass
class Setup:
    """What a bug changes before the engine is built (mutated in place by a BugSpec)."""

    draft_config: dict[str, Any]
    checkpoint: dict[str, torch.Tensor]
    algorithm: str = "EAGLE3"
    engine_version: str = "0.5.23"
    norm_before_residual_draft: bool = False
    data_dir: Path = DATA_DIR


@dataclass(frozen=True)
class BugSpec:
    name: str
    description: str
    how: str  # how the build differs from healthy, in one line
    apply: Callable[[Setup], None]
    uses_nbr_draft: bool = False


@dataclass
class Scenario:
    """One engine build: the models plus everything a detector may want to check."""

    name: str
    description: str
    target: Eagle3Target
    draft: Eagle3Draft
    draft_config: dict[str, Any]  # as config.json would hold it
    trainer_convention: str
    trained_ids: list[int]
    trained_boundaries: list[int]  # what the draft was really trained on
    algorithm: str  # --speculative-algorithm
    engine_version: str
    engine_convention: str
    checkpoint: dict[str, torch.Tensor]  # tensors offered to draft.load_weights
    engine_param_names: list[str]
    data_dir: Path = DATA_DIR

    def run(self, prompts: Sequence[Sequence[int]] | None = None, k: int = 4, max_new_tokens: int | None = None) -> float:
        """Mean accept length over the demo prompts (or ``prompts``) with chain length ``k``."""
        prompts = demo_prompts(self.data_dir) if prompts is None else prompts
        new = demo_max_new_tokens(self.data_dir) if max_new_tokens is None else max_new_tokens
        return mean_accept_length(self.target, self.draft, prompts, k=k, max_new_tokens=new)


# ----------------------------------------------------------------------------- the bugs


def _nothing(setup: Setup) -> None:
    pass


def _no_aux(setup: Setup) -> None:
    setup.draft_config["eagle_config"]["use_aux_hidden_state"] = False


def _eagle(setup: Setup) -> None:
    setup.algorithm = "EAGLE"


def _speculators_names_older_engine(setup: Setup) -> None:
    # The trainer wrote layers.0.* (speculators); SGLang before 0.5.14 only knows midlayer.*
    # (0.5.14 and later read both: the healthy scenario's engine).
    embed = load_target_model(setup.data_dir).get_input_embeddings().weight
    setup.checkpoint = speculators_checkpoint(setup.checkpoint, embed)
    setup.engine_version = "older"


def _drop(name: str) -> Callable[[Setup], None]:
    def apply(setup: Setup) -> None:
        setup.checkpoint.pop(name, None)

    return apply


def _speculators_ids_verbatim(setup: Setup) -> None:
    # Trained by speculators on boundaries [0, 2, 4] (its ids mean boundaries); the ids
    # were copied verbatim into eagle_config, where SGLang's Llama rule adds 1.
    ids = [0, 2, 4]
    setup.draft_config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = ids
    setup.draft_config["trainer_convention"] = "speculators"
    setup.draft_config["trained_aux_layer_ids"] = ids
    setup.draft_config["trained_aux_boundaries"] = trainer_boundaries(ids, "speculators")


def _shifted_capture(setup: Setup) -> None:
    # Trained on cat(embedding, hs[2], hs[4]); the engine ids capture cat(hs[2], hs[4], hs[5]).
    setup.draft_config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [1, 3, 4]


def _norm_before_residual(setup: Setup) -> None:
    setup.norm_before_residual_draft = True


def _past_end(setup: Setup) -> None:
    # ids counted up to the layer count: SGLang's +1 pushes 5 and 6 past the last layer.
    setup.draft_config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [1, 5, 6]


BUGS: dict[str, BugSpec] = {
    spec.name: spec
    for spec in [
        BugSpec("healthy", "trained and served on cat(hs[0], hs[2], hs[4]); every tensor loads", "nothing changed", _nothing),
        BugSpec(
            "fc_bypass",
            "no aux capture: the target stores its final normed state (64 wide), so fc is skipped silently",
            "eagle_config.use_aux_hidden_state = false",
            _no_aux,
        ),
        BugSpec(
            "eagle_algorithm",
            "an EAGLE-3 draft launched with --speculative-algorithm EAGLE: no capture, fc skipped silently",
            "algorithm EAGLE instead of EAGLE3",
            _eagle,
        ),
        BugSpec(
            "layers0_names",
            "speculators checkpoint (layers.0.*) on SGLang before 0.5.14, whose loader expects midlayer.*: the decoder layer stays random",
            "checkpoint renamed midlayer.* -> layers.0.* (+ embed_tokens), engine_version 'older'",
            _speculators_names_older_engine,
        ),
        BugSpec(
            "lm_head_missing",
            "checkpoint without lm_head while draft_vocab_size is set: the head stays at random init",
            "lm_head.weight removed from the checkpoint",
            _drop("lm_head.weight"),
        ),
        BugSpec(
            "d2t_missing",
            "checkpoint without d2t: draft ids are taken as target ids",
            "d2t removed from the checkpoint",
            _drop("d2t"),
        ),
        BugSpec(
            "off_by_one",
            "speculators ids [0, 2, 4] (boundaries) served through SGLang's +1 rule: captures hs[1], hs[3], hs[5]",
            "trainer speculators; eagle_config ids [0, 2, 4] copied verbatim",
            _speculators_ids_verbatim,
        ),
        BugSpec(
            "embedding_vs_layer",
            "trained on cat(embedding, hs[2], hs[4]) but served cat(hs[2], hs[4], hs[5]): same 192 width",
            "eagle_config ids [1, 3, 4] instead of [-1, 1, 3]",
            _shifted_capture,
        ),
        BugSpec(
            "norm_before_residual",
            "draft trained with norm_before_residual=true; the engine ignores the flag",
            "the norm_before_residual draft, config flag set, engine ignores it",
            _norm_before_residual,
            uses_nbr_draft=True,
        ),
        BugSpec(
            "capture_id_past_end",
            "ids [1, 5, 6] on a 6-layer target: 5 and 6 shift past the end and drop silently; one 64-wide chunk, fc skipped",
            "eagle_config ids [1, 5, 6]",
            _past_end,
        ),
    ]
}


def engine_capture_ids(draft_config: dict[str, Any]) -> list[int] | None:
    """The ids SGLang 0.5.23 reads: ``eagle_config.eagle_aux_hidden_state_layer_ids`` only (None: defaults)."""
    eagle = draft_config.get("eagle_config") or {}
    ids = eagle.get("eagle_aux_hidden_state_layer_ids")
    return None if ids is None else [int(i) for i in ids]


def engine_uses_aux(draft_config: dict[str, Any], algorithm: str) -> bool:
    """SGLang switches capture on for EAGLE3 when the draft's ``use_aux_hidden_state`` is true (default)."""
    eagle = draft_config.get("eagle_config") or {}
    return algorithm.upper() == "EAGLE3" and bool(eagle.get("use_aux_hidden_state", True))


def build_scenario(name: str, data_dir: Path = DATA_DIR, load: bool = True) -> Scenario:
    """Build the engine as bug ``name`` leaves it (see ``BUGS``).

    >>> build_scenario("capture_id_past_end").target.capture.boundaries
    [2]
    """
    if name not in BUGS:
        raise KeyError(f"unknown scenario {name!r}; known: {', '.join(BUGS)}")
    spec = BUGS[name]
    data_dir = Path(data_dir)
    checkpoint, config = load_draft_checkpoint(spec.uses_nbr_draft, data_dir)
    setup = Setup(draft_config=copy.deepcopy(config), checkpoint=dict(checkpoint), data_dir=data_dir)
    spec.apply(setup)

    model = load_target_model(data_dir)
    target = Eagle3Target(
        model,
        layer_ids=engine_capture_ids(setup.draft_config),
        convention=ENGINE_CONVENTION,
        aux_enabled=engine_uses_aux(setup.draft_config, setup.algorithm),
    )
    if engine_capture_ids(setup.draft_config) is None and target.aux_enabled:
        target.set_eagle3_layers_to_capture(None)  # SGLang's literal default ids

    # The engine honours nothing but its own reading of the config (norm_before_residual ignored).
    draft = Eagle3Draft(DraftConfig.from_dict(setup.draft_config), setup.engine_version, honor_norm_before_residual=False)
    if load:
        # With load=False the caller loads ``scenario.checkpoint`` itself (e.g. observed
        # by spectrace) and then calls ``draft.set_embed(target.get_embed())``.
        draft.load_weights(as_loadable(setup.checkpoint))
        draft.set_embed(target.get_embed())
    draft.eval()

    return Scenario(
        name=name,
        description=spec.description,
        target=target,
        draft=draft,
        draft_config=setup.draft_config,
        trainer_convention=str(setup.draft_config.get("trainer_convention", "")),
        trained_ids=list(setup.draft_config.get("trained_aux_layer_ids", [])),
        trained_boundaries=list(setup.draft_config.get("trained_aux_boundaries", [])),
        algorithm=setup.algorithm,
        engine_version=setup.engine_version,
        engine_convention=ENGINE_CONVENTION,
        checkpoint=setup.checkpoint,
        engine_param_names=draft.engine_param_names(),
        data_dir=data_dir,
    )


def measure_all(k: int = 4, data_dir: Path = DATA_DIR) -> dict[str, float]:
    """Mean accept length of every scenario on the demo prompts.

    >>> measure_all()["healthy"] >= 2.0
    True
    """
    return {name: round(build_scenario(name, data_dir).run(k=k), 3) for name in BUGS}
