"""The parts of the view model: what ``spectrace view`` shows, as data, and the filter it
was asked for.

Every part is a pydantic model so ``spectrace view --json`` is ``model_dump_json()`` and
tests can assert on data, not on pixels. The builders fill them (:mod:`.model` drives them).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from spectrace.records import TensorStats
from spectrace.rules.globs import suffix_match

DEFAULT_WINDOW = 32  # the data path's recent span: the last N traced steps


class ViewFilter(BaseModel):
    """What ``spectrace view`` was asked to narrow to."""

    module: str | None = None  # glob, matched against the full name and as a suffix
    rank: int | None = None
    step_min: int | None = None
    step_max: int | None = None
    finding: str | None = None
    window_steps: int = DEFAULT_WINDOW  # the data path's recent span: the last N traced steps

    def step_ok(self, step: int | None) -> bool:
        if step is None:
            return True
        if self.step_min is not None and step < self.step_min:
            return False
        return self.step_max is None or step <= self.step_max

    def module_ok(self, name: str | None) -> bool:
        return self.module is None or (name is not None and name_matches(name, self.module))

    def finding_ok(self, fd: Any) -> bool:
        """A finding record passes ``--step`` and ``--module`` (``--finding`` is applied apart)."""
        return self.step_ok(fd.step) and (not self.module or self.module_ok(fd.module))

    @property
    def steps_text(self) -> str:
        lo, hi = self.step_min, self.step_max
        return f"{lo}" if lo == hi and lo is not None else f"{'' if lo is None else lo}:{'' if hi is None else hi}"


def name_matches(name: str, pattern: str) -> bool:
    """``--module`` and the name rules: the one glob dialect, on the full dotted name or any
    dotted suffix (roots differ between engines).

        >>> name_matches("draft.model.fc", "model.fc"), name_matches("model.fc", "*fc")
        (True, True)
    """
    return suffix_match(name, pattern)


# ----------------------------------------------------------------------------------- parts
class ProcessInfo(BaseModel):
    file: str
    host: str | None = None
    pid: int | None = None
    process_id: str = ""  # the header's random id: tells apart processes of one host and pid
    rank: int | None = None
    schema_version: int | None = None
    spectrace_version: str | None = None
    records: int = 0
    # "closed" (its closing counters record is there), "running" (no closing record yet and
    # its process is alive on this host) or "not closed" (crashed or killed).
    state: str = "closed"
    last_record: str | None = None  # ISO UTC of the newest time stamp in the file


class HeaderSummary(BaseModel):
    source: str
    processes: list[ProcessInfo] = []
    ranks: list[int] = []
    step_first: int | None = None
    step_last: int | None = None
    steps_traced: int = 0
    started: str | None = None  # ISO UTC of the earliest header
    span_s: float | None = None
    records_dropped: int = 0
    # records_dropped split by the reason the writer recorded ("sink error", "record cap", ...)
    dropped_by_reason: dict[str, int] = {}
    # Files without their closing record: their drop counts were never written, so
    # "records dropped" is not known for them. One line each, e.g. "<file>: not closed ...".
    not_closed: list[str] = []
    hook_calls: int = 0  # spectrace's serving-engine hooks: how often they ran, and their host time
    # Steady state: start-up (graph capture, each hook's first calls) is paid once, so it is
    # in neither the per-call nor the per-step figures but in hook_startup_* alone.
    hook_us_per_call: float | None = None
    hook_steady_calls: int = 0
    hook_startup_calls: int = 0
    hook_startup_ms: float | None = None  # host time of the start-up calls, all of them together
    hook_us_per_verify_step: float | None = None
    hook_us_per_verify_step_by_feature: dict[str, float] = {}  # largest first
    # the part of the per-step figure spent in calls over 100 us (a lost CPU or a GIL wait)
    hook_us_per_verify_step_in_slow_calls: float | None = None
    coverage_gaps: list[str] = []
    graph_traced: str | None = None  # how replayed CUDA graphs were traced (in-graph statistics), if they were
    load_problems: list[str] = []
    # SPECTRACE_CAPTURE_VALUES: "FILE (N tokens x S steps)" per values file beside the trace (user data)
    values: list[str] = []


class FindingGroup(BaseModel):
    code: str
    severity: str
    count: int
    first_step: int | None = None
    last_step: int | None = None
    message: str
    cause: str
    fix: str
    modules: list[str] = []
    ranks: list[int] = []
    evidence: dict[str, Any] = {}
    # Root causes (decided by spectrace.checks.root_causes): a consequence names the finding
    # it follows from and the root at the top of that chain, whose fix clears it; a root
    # lists its consequences. Both None / empty: the finding stands alone.
    follows_from: str | None = None
    root: str | None = None
    how: str = ""  # why it follows from follows_from
    root_fix: str | None = None  # the root's fix: the one to apply
    also_from: list[str] = []  # other root causes shown that explain it as well
    consequences: list[str] = []


class StatsSummary(BaseModel):
    """Aggregate of TensorStats over calls: mean of means, mean of stds, max absmax, nan/inf sums."""

    mean: float | None = None
    std: float | None = None
    absmax: float | None = None
    nan: int = 0
    inf: int = 0
    samples: int = 0


class MomentStats(BaseModel):
    """The statistics of many records' tensors combined as if they were one tensor: the
    mean weighted by numel, the pooled (population) std, the largest absmax, nan/inf summed.

    Records without a finite mean/std (a NaN in the tensor) add their nan/inf counts only.
    """

    mean: float | None = None
    std: float | None = None
    absmax: float | None = None
    nan: int = 0
    inf: int = 0
    numel: int = 0  # the values mean and std cover
    records: int = 0  # records that carried statistics (one inside a graph capture has none)


class SpanStats(BaseModel):
    """Records of one slice of a stage over one span of steps (the whole run, or the window)."""

    records: int = 0
    graph_replay: int = 0  # statistics computed inside a replayed CUDA graph
    graph_capture: int = 0  # recorded while a graph was captured: shapes only
    eager: int = 0  # the others: eager steps
    rows: int | None = None  # real (unpadded) token rows, summed; None when no record says
    output: MomentStats | None = None
    input: MomentStats | None = None  # the first input (fc: the fused [T, 3H] draft input)


class SliceView(BaseModel):
    """One slice of a stage's records: one forward mode, one draft step, or all of them."""

    label: str  # the forward mode, "draft step N", or "all"
    forward_mode: str | None = None
    draft_step: int | None = None
    run: SpanStats = SpanStats()
    window: SpanStats = SpanStats()  # the last ``DataPath.window_steps`` traced steps


class LiveChunkView(BaseModel):
    """One chunk of the aux concat output (``output.chunk[i]``): one captured boundary."""

    index: int
    boundary: int | None = None
    width: int | None = None
    total: SliceView
    modes: list[SliceView] = []
    flags: list[str] = []


class FcWidths(BaseModel):
    """What fc was handed vs what it takes: the fc-bypass bug is an fc input as wide as the
    hidden size (the target captured no aux layers) and fc skipped."""

    in_widths: list[int] = []  # last dims of the draft's fused input (see in_from)
    in_from: str = ""  # "fc input", "fc_bypass finding", "aux concat output"
    in_features: int | None = None
    in_features_from: str = ""  # "fc input", "fc_bypass finding", "capture (expected)"
    hidden: int | None = None
    hidden_from: str = ""
    verdict: str = "unknown"  # ok / bypass / mismatch / unknown
    note: str = ""


class StageView(BaseModel):
    role: str
    modules: list[str] = []
    calls: int = 0
    in_shapes: list[list[int]] = []
    out_shapes: list[list[int]] = []
    dtypes: list[str] = []
    last: TensorStats | None = None
    # The whole run's output statistics combined by numel (see MomentStats); samples: the
    # records that carried statistics.
    agg: StatsSummary | None = None
    anomalies: list[str] = []
    status: str = "not seen"  # called / bypassed / not seen / loaded / missing ...
    note: str = ""
    total: SliceView | None = None  # every record of the stage
    modes: list[SliceView] = []  # one per forward mode seen (one "all" when none is recorded)
    draft_steps: list[SliceView] = []  # one per draft step of a multi-step draft, where recorded
    chunks: list[LiveChunkView] = []  # aux concat: its output chunks
    widths: FcWidths | None = None  # fc: its input width against in_features and hidden


class BoundaryView(BaseModel):
    """A captured boundary's source in the target: boundary b is ``target.layer[b-1]``'s
    output residual stream (b = 0: the embedding output)."""

    boundary: int
    role: str
    module: str | None = None
    total: SliceView | None = None  # None: that layer was never recorded
    modes: list[SliceView] = []
    # b0's own records carry no statistics (an embedding row identifies its token; see
    # docs/settings.md): its row then shows those of the aux concat chunk it feeds, and
    # this says so ("aux concat chunk 0"); None: the row's statistics are its own.
    stats_from: str | None = None


class CaptureView(BaseModel):
    module: str
    requested_ids: list[int] | None = None
    boundaries: list[int] = []
    num_layers: int
    hidden_size: int
    rule: str
    enabled: bool
    layers: list[BoundaryView] = []


class ChunkView(BaseModel):
    index: int
    boundary: int | None = None
    stats: TensorStats
    flags: list[str] = []


class FingerprintView(BaseModel):
    module: str
    chunk_width: int
    chunks: list[ChunkView] = []
    samples: int = 0


class DataPath(BaseModel):
    captures: list[CaptureView] = []
    aux: StageView
    fingerprints: list[FingerprintView] = []
    fc: StageView
    layer: StageView
    norm: StageView
    lm_head: StageView
    d2t: StageView
    target_lm_head: StageView = StageView(role="target_lm_head")
    window_steps: int = DEFAULT_WINDOW  # the recent span: the last N traced steps ...
    window_first_step: int | None = None  # ... from this step
    window_last_step: int | None = None  # ... to this one
    steps_seen: int = 0  # traced steps (of call records) in the run
    roles: bool = False  # the trace names each call's role (else stages are told by names)
    draft_vocab: int | None = None  # the draft lm_head's output width
    target_vocab: int | None = None  # the target lm_head's output width (d2t maps between them)
    module_filter: str | None = None  # --module: the stages it names; the others say so
    # An EAGLE-3 pair was traced: a draft (its roles, an fc, or names that say draft/eagle),
    # an aux concat or a capture record. Only then is there a data path to draw; a plain
    # model's layers are not a draft's, and a missing fc is no bypass.
    eagle3: bool = False


class AcceptanceView(BaseModel):
    steps: list[int] = []
    mean_accept: list[float] = []
    batch: list[int] = []  # requests verified in each of those steps
    overall_mean: float | None = None
    draft_tokens: int | None = None
    requests: int = 0
    position_rate: list[float] = []


class ModuleRow(BaseModel):
    module: str
    module_type: str = ""
    role: str | None = None  # Call.role: draft.fc, target.layer[3], ... (None before roles)
    calls: int = 0
    out_shapes: list[list[int]] = []
    dtypes: list[str] = []
    agg: StatsSummary
    anomalies: list[str] = []  # from the recorded statistics, and a nonfinite finding naming it


class TraceView(BaseModel):
    header: HeaderSummary
    findings: list[FindingGroup] = []
    datapath: DataPath
    acceptance: AcceptanceView
    modules: list[ModuleRow] = []
    # A filter that matched nothing, in one line naming it and what the trace holds: the
    # view of an empty selection would read as a healthy run.
    filter_problem: str | None = None
