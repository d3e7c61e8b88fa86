"""``weights_replaced_after_load``: a trained draft tensor that an engine step swapped out.

The draft's load can be perfect and its trained ``lm_head`` still never run: SGLang
0.5.23 gives a draft whose config says ``"draft_vocab_size": null`` the target's head
(``load_lm_head_from_target``; ``EAGLEWorkerV2.init_lm_head`` calls
``set_embed_and_head`` after the load), and shares the target's embedding with any draft
as wide as the target (``set_embed``). The integrations fingerprint what the load wrote
and compare it at the draft's first forward; this check words what changed.

Only parameters the checkpoint had are compared, so a tensor the engine shares because
the checkpoint had none (the usual embedding) says nothing, and neither does a swap for
a tensor of the very same values (a trainer that froze the target's embedding).

    >>> check_replaced_weights([ReplacedWeight("lm_head.weight", "replaced", shared_with="lm_head.weight")],
    ...                        moment="first forward")[0].code
    'weights_replaced_after_load'
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from ..records import Finding
from ..rules.catalogue import finding

SOURCE = "checks.replaced"


class ReplacedWeight(NamedTuple):
    """One draft parameter that differs from what its load wrote.

    ``how``: ``replaced`` (another tensor now) or ``changed`` (its values, in place);
    ``shared_with``: the target parameter whose storage it now is; ``step``: the engine
    step that does this; ``trigger``: the config key that makes the engine take it;
    ``fix``: how to keep the trained tensor."""

    name: str
    how: str
    shared_with: str | None = None
    step: str | None = None
    trigger: str | None = None
    fix: str | None = None


def _what(item: ReplacedWeight) -> str:
    if item.shared_with:
        return f"{item.name} now shares the target's {item.shared_with}"
    if item.how == "replaced":
        return f"{item.name} is another tensor now"
    return f"{item.name} was overwritten in place"


def check_replaced_weights(changed: Sequence[ReplacedWeight], *, moment: str, module: str = "draft", source: str = SOURCE) -> list[Finding]:
    """One error naming every trained draft tensor replaced between its load and ``moment``."""
    if not changed:
        return []
    steps = list(dict.fromkeys(c.step for c in changed if c.step))
    triggers = list(dict.fromkeys(c.trigger for c in changed if c.trigger))
    fixes = list(dict.fromkeys(c.fix for c in changed if c.fix))
    by = f" by {'; '.join(steps)}" if steps else ""
    because = f", because {'; '.join(triggers)}" if triggers else ""
    message = (
        f"{len(changed)} trained draft tensor{'s' if len(changed) > 1 else ''} loaded from the checkpoint "
        f"{'differ' if len(changed) > 1 else 'differs'} at the {moment}: {'; '.join(_what(c) for c in changed)}{by}{because}. "
        "The draft runs with weights it was not trained with"
    )
    return [
        finding(
            "weights_replaced_after_load",
            message,
            module=module,
            evidence={
                "parameters": [c.name for c in changed],
                "how": {c.name: c.how for c in changed},
                "shared_with": {c.name: c.shared_with for c in changed if c.shared_with},
                "engine_step": steps,
                "trigger": triggers,
                "moment": moment,
            },
            fix="; ".join(fixes) if fixes else None,
            source=source,
        )
    ]
