"""Watch a reference EAGLE-3 pipeline: static facts and live contracts become records.

The tracing engine (spectrace.hooks) records what each module did; this module adds what only an
EAGLE-3-aware observer knows: the capture in effect (``capture``), what the weight load
did (``weights``), whether the states the target hands the draft fit ``fc``, the
per-chunk fingerprint of those states, and the accept lengths. Detectors then turn
the records into findings.

    >>> with spectrace.trace({"target": target, "draft": draft}, profile="eagle3") as t:
    ...     watch = PipelineWatch(t, target, draft, config, algorithm="EAGLE3")
    ...     watch.load(checkpoint)
    ...     speculate(target, draft, prompt, on_step=watch.on_step)
    ...     watch.finish()
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..api import Trace
from ..checks.calls import check_acceptance, check_feature_skew, check_nonfinite
from ..checks.capture import check_algorithm, check_capture, check_config_flags
from ..checks.weights import check_hot_token_map, check_weights
from ..checks.widths import check_target_handoff_width
from ..hooks.weights import observe_load
from ..records import Acceptance, Call, Capture, Fingerprint
from .fingerprint import FingerprintCollector
from .target import Eagle3Target

NUM_AUX = 3  # SGLang's EAGLE-3 draft hard-codes three aux chunks


class PipelineWatch:
    """Observer for one (target, draft) pair inside a ``spectrace.trace`` context."""

    def __init__(
        self,
        trace: Trace,
        target: Eagle3Target,
        draft: Any,
        config: Mapping[str, Any],
        *,
        algorithm: str = "EAGLE3",
        reference: Fingerprint | None = None,
        target_name: str = "target",
        draft_name: str = "draft",
        temperature: float | None = None,
    ) -> None:
        self.trace = trace
        self.target = target
        self.draft = draft
        self.config = dict(config)
        self.algorithm = algorithm
        self.reference = reference
        self.target_name = target_name
        self.draft_name = draft_name
        # The temperature speculate() verifies at, when the caller says it (recorded with each
        # step, so acceptance findings tell greedy from sampled requests); None: not said.
        self.temperature = temperature
        self.collector = FingerprintCollector(NUM_AUX)
        self.acceptance: list[Acceptance] = []
        self._step = 0
        self._width_reported = False
        self._handle = target.register_forward_hook(self._on_target_output)
        self.trace.set_step(0)
        self._record_static()

    # ------------------------------------------------------------ static facts
    def _record_static(self) -> None:
        t = self.target
        capture = Capture(
            module=self.target_name,
            requested_ids=list(t.capture.ids),
            boundaries=list(t.capture.boundaries) if t.aux_enabled else [],
            num_layers=t.num_layers,
            hidden_size=t.hidden_size,
            rule=t.convention,
            enabled=bool(t.aux_enabled),
        )
        self.capture = capture
        self.trace.emit(capture)
        for found in [
            *check_algorithm(self.algorithm, self.config),
            *check_capture(capture, self.config, self.algorithm),
            *check_config_flags(self.config),
        ]:
            self.trace.emit(found)

    def load(self, checkpoint: Mapping[str, torch.Tensor]) -> None:
        """Load ``checkpoint`` through the draft's own ``load_weights``, observed."""
        exempt = [n for n, _ in self.draft.named_parameters() if n.endswith("embed_tokens.weight")]
        if getattr(self.draft, "load_lm_head_from_target", False):
            exempt += [n for n, _ in self.draft.named_parameters() if n.startswith("lm_head")]
        _, weights = observe_load(
            self.draft,
            self.draft.load_weights,
            ((n, t.float() if t.is_floating_point() else t) for n, t in checkpoint.items()),
            module=self.draft_name,
            exempt=exempt,
            source="load_weights",
        )
        self.trace.emit(weights)
        for found in check_weights(weights):
            self.trace.emit(found)
        for found in check_hot_token_map(
            self.config.get("draft_vocab_size"),
            self.config.get("vocab_size"),
            self.draft.get_hot_token_id() is not None,
            module=f"{self.draft_name}.hot_token_id",
            source="eagle3.watch",
        ):
            self.trace.emit(found)

    # ------------------------------------------------------------ live checks
    def _on_target_output(self, module: Any, args: Any, output: Any) -> None:
        try:
            states = output.hidden_states
            width = int(states.shape[-1])
            fc_in = int(self.draft.model.fc.in_features)
            if width == fc_in:
                self.collector.observe(states)
                return
            if self._width_reported:
                return
            self._width_reported = True
            embed_width = int(self.draft.model.embed_tokens.embedding_dim)
            for found in check_target_handoff_width(
                width,
                fc_in,
                embed_width,
                NUM_AUX,
                aux_enabled=self.target.aux_enabled,
                module=f"{self.draft_name}.model.fc",
                step=self._step,
                source="eagle3.watch",
            ):
                self.trace.emit(found)
        except Exception as exc:  # never into the pipeline
            self.trace.recorder.internal_error(f"eagle3 watch: {type(exc).__name__}: {exc}")

    def on_step(self, step: int, accept_length: int, mask: list[bool]) -> None:
        """``speculate(..., on_step=watch.on_step)``: one acceptance record per verify."""
        record = Acceptance(
            step=self._step,
            accept_lengths=[accept_length],
            draft_tokens=len(mask),
            accepted_per_position=[int(m) for m in mask],
        )
        if self.temperature is not None:
            record.greedy = [self.temperature <= 0]
            record.temperatures = [float(self.temperature)]
        self.acceptance.append(record)
        self.trace.emit(record)
        self._step += 1
        self.trace.set_step(self._step)

    # ----------------------------------------------------------------- finish
    def finish(self) -> list[Any]:
        """Run the detectors that need the whole run; returns every finding of the trace."""
        self._handle.remove()
        fingerprint = self.collector.result(f"{self.target_name}.aux_concat", self.capture.boundaries)
        if fingerprint is not None:
            self.trace.emit(fingerprint)
            if self.reference is not None:
                for found in check_feature_skew(fingerprint, self.reference):
                    self.trace.emit(found)
        for found in check_acceptance(self.acceptance):
            self.trace.emit(found)
        for found in check_nonfinite(c for c in self.trace.records if isinstance(c, Call)):
            self.trace.emit(found)
        return self.trace.findings
