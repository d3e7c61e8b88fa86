"""The trace record schema: what spectrace writes, one JSON object per line.

This module is a leaf: it imports pydantic and nothing else of ours, so the viewers
can read traces without torch. Every record carries ``type`` (the discriminator) and
the file's first line is a :class:`Header` that names ``schema_version``.

    >>> Call(step=0, seq=3, module="model.fc", module_type="Linear").model_dump_json()
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_serializer

SCHEMA_VERSION = 2  # 2: role on calls, time stamps, once counts, the closing record named "counters"

Severity = Literal["error", "warning", "info"]
SEVERITY_RANK: dict[str, int] = {"error": 0, "warning": 1, "info": 2}


class _Record(BaseModel):
    # Unknown keys from a newer minor writer are kept rather than rejected.
    model_config = ConfigDict(extra="allow")

    def bump(self, name: str, delta: float = 1) -> None:
        """Add to a numeric field on a hot path. These fields have no validator, and
        pydantic's ``__setattr__`` costs about 1 us where a dict update costs 0.05: a
        serving engine's step bumps several."""
        self.__dict__[name] += delta


class TensorStats(_Record):
    """Statistics of one tensor, computed on its device (float64 on the host side).

    A statistic that makes no sense for the tensor's kind (bool, meta, empty) is None.
    """

    mean: float | None = None
    std: float | None = None
    absmax: float | None = None
    nan: int | None = None
    inf: int | None = None
    numel: int | None = None


class TensorMeta(_Record):
    """Shape, dtype, device and (optionally) statistics of one tensor argument."""

    arg: str = Field(description="where the tensor sat: input[0], kwarg.hidden_states, output, output.logits, ...")
    shape: list[int]
    dtype: str
    device: str
    stats: TensorStats | None = None


class Header(_Record):
    type: Literal["header"] = "header"
    schema_version: int = SCHEMA_VERSION
    spectrace_version: str
    pid: int
    host: str
    rank: int | None = None
    argv: list[str] = []
    started_unix: float
    settings: dict[str, Any] = {}
    versions: dict[str, str] = {}
    process_id: str = Field(
        "",
        description="random, drawn at start (and again in a forked child): tells apart processes of one host "
        "name and pid, such as containers sharing a trace volume ('' in older traces)",
    )


class Call(_Record):
    """One module call: its inputs and outputs."""

    type: Literal["call"] = "call"
    step: int
    seq: int = Field(description="call order within the process")
    module: str
    module_type: str
    root: str = ""
    inputs: list[TensorMeta] = []
    outputs: list[TensorMeta] = []
    t_unix: float = 0.0
    graph_capture: bool = Field(False, description="recorded while a CUDA graph was being captured")
    role: str | None = Field(
        None,
        description="what the module is in the EAGLE-3 data path, decided from the module tree when it was hooked: "
        "target.embed, target.layer[k], target.norm, target.lm_head, target.aux_concat, draft.embed, draft.fc, "
        "draft.layer, draft.hidden_norm, draft.norm, draft.lm_head; None for any other module (and in traces "
        "written before roles existed)",
    )
    forward_mode: str | None = Field(
        None,
        description="the serving engine's forward mode of the step: EXTEND, DECODE, TARGET_VERIFY, DRAFT_EXTEND, ... (None outside an engine)",
    )
    tokens: int | None = Field(None, description="the real (unpadded) token rows of the step; statistics cover these rows only")
    draft_step: int | None = Field(None, description="index of the draft forward within one multi-step draft (0 for the first)")
    graph_replay: bool = Field(False, description="statistics computed inside a replayed CUDA graph (read back after the replay)")
    graph: str | None = Field(None, description="the captured graph these statistics came from: runner and shape key")


class Finding(_Record):
    """A diagnosis: what was seen, where, and the fix."""

    type: Literal["finding"] = "finding"
    code: str
    severity: Severity
    message: str
    module: str | None = None
    evidence: dict[str, Any] = {}
    fix: str
    step: int | None = None
    source: str = ""
    t_unix: float | None = Field(None, description="when it was recorded (the writer stamps it)")
    once_key: str | None = Field(
        None,
        description="set when the writer says this record once and counts repeats: the counters record's once_counts[once_key] is the true count",
    )


class Acceptance(_Record):
    """Accept lengths of one verify step (one entry per request in the batch)."""

    type: Literal["acceptance"] = "acceptance"
    step: int
    accept_lengths: list[int]
    draft_tokens: int = Field(description="tokens proposed per request (k)")
    accepted_per_position: list[int] = Field(default=[], description="how many requests accepted the draft token at position i")
    # The verified requests' sampling, one entry per request as in accept_lengths; absent
    # (not written) when the engine did not say, as in traces written before them.
    greedy: list[bool] | None = Field(
        None, description="per request: verified greedily (temperature 0 or top_k 1); absent when the engine did not say"
    )
    temperatures: list[float] | None = Field(None, description="per request: the sampling temperature (absent for an all-greedy step)")
    top_ps: list[float] | None = Field(None, description="per request: top_p (absent for an all-greedy step)")
    top_ks: list[int] | None = Field(None, description="per request: top_k, -1 for none (absent for an all-greedy step)")
    prompt_tokens: list[int] | None = Field(
        None, description="per request: its prompt's length in tokens (drift compares like traffic); absent when the engine did not say"
    )

    @model_serializer(mode="wrap")
    def _drop_absent_sampling(self, handler: Any) -> Any:
        # Absent sampling is not written, so a record without it is the line it always was.
        data = handler(self)
        if isinstance(data, dict):
            for key in _SAMPLING_KEYS:
                if key in data and data[key] is None:
                    del data[key]
        return data


_SAMPLING_KEYS = ("greedy", "temperatures", "top_ps", "top_ks", "prompt_tokens")


class Coverage(_Record):
    """What spectrace could not see: said once, loudly, and counted."""

    type: Literal["coverage"] = "coverage"
    kind: Literal["graph_replay", "not_covered", "dropped", "internal_error", "sink_error", "unhooked"]
    detail: str
    count: int = 1
    step: int | None = None
    t_unix: float | None = Field(None, description="when it was recorded (the writer stamps it)")
    once_key: str | None = Field(
        None,
        description="set when the writer says this record once and counts repeats: the counters record's once_counts[once_key] is the true count",
    )


class Weights(_Record):
    """What a weight load did: names offered, parameters written, names ignored."""

    type: Literal["weights"] = "weights"
    module: str
    offered: list[str] = []
    written: list[str] = []
    ignored: list[str] = []
    missing: list[str] = []
    source: str = ""
    t_unix: float | None = Field(None, description="when it was recorded (the writer stamps it)")


class Capture(_Record):
    """The aux-hidden-state capture in effect on a target, in canonical boundary indices.

    Boundary b is Hugging Face ``hidden_states[b]``: 0 the embedding output, b the output
    of block b-1.
    """

    type: Literal["capture"] = "capture"
    module: str
    requested_ids: list[int] | None = None
    boundaries: list[int] = []
    num_layers: int
    hidden_size: int
    rule: str = Field(description="the engine rule that mapped ids to boundaries")
    enabled: bool = True
    t_unix: float | None = Field(None, description="when it was recorded (the writer stamps it)")


class Fingerprint(_Record):
    """Per-chunk statistics of the fused draft input ``cat(hs[b0], hs[b1], hs[b2])``."""

    type: Literal["fingerprint"] = "fingerprint"
    module: str
    chunk_width: int
    chunks: list[TensorStats]
    boundaries: list[int] | None = None


class Values(_Record):
    """Tensor values kept beside the trace (``SPECTRACE_CAPTURE_VALUES=N``): user data.

    The first rows of the fused draft input (the aux concat the draft's fc reads) and their
    token ids, for a few steps, in a safetensors file: ``spectrace compare-train`` recomputes
    the target's hidden states for the same ids and says which boundary each chunk is.
    """

    type: Literal["values"] = "values"
    file: str = Field(description="the safetensors file, a name in the trace's folder (<trace stem>.values.safetensors)")
    module: str = Field(description="where the values were taken: the aux concat (the fused draft input)")
    tokens: int = Field(description="SPECTRACE_CAPTURE_VALUES: the most token rows kept per step")
    steps: list[int] = Field(description="the steps whose rows were kept")
    rows: list[int] = Field(description="token rows kept per step (each a sequence from position 0)")
    width: int = Field(description="width of one fused row (chunks x hidden)")
    dtype: str = Field(description="the fused input's dtype as served (kept as is)")
    boundaries: list[int] | None = Field(None, description="the boundaries the capture record says the chunks are, when known")
    t_unix: float | None = Field(None, description="when it was recorded (the writer stamps it)")


class Counters(_Record):
    """Run counters written at flush: what was recorded and what was lost."""

    # "counters" since schema 2; traces written before call it "stats" (read the same).
    type: Literal["counters", "stats"] = "counters"
    steps: int = 0
    calls_seen: int = 0
    steps_untraced: int = Field(
        0,
        description="steps left out by sampling (SPECTRACE_SAMPLE, SPECTRACE_BUDGET): their calls are counted in calls_seen, not recorded",
    )
    records_written: int = 0
    records_dropped: int = 0
    internal_errors: int = 0
    sink_errors: int = 0
    otlp_spans_lost: int = Field(
        0, description="spans handed to the OpenTelemetry exporter that the collector never confirmed (down, failing, hanging at exit)"
    )
    graph_replay_steps: int = 0
    graph_replays_traced: int = Field(0, description="CUDA-graph replays whose graph carries statistics kernels (traced per module)")
    graph_tables: int = Field(0, description="CUDA graphs captured with a statistics table (one per runner and shape)")
    graph_table_bytes: int = Field(0, description="device memory of those tables, all graphs together")
    graph_readbacks: int = Field(0, description="graph replays whose statistics were read back (1 in SPECTRACE_GRAPH_SAMPLE)")
    graph_readbacks_dropped: int = Field(0, description="read-backs lost because the pinned ring was full (counted, never waited for)")
    stats_skipped_modified: int = Field(
        0, description="tensors whose statistics were skipped: written in place after their call and before their statistics were taken"
    )
    hook_calls: int = Field(0, description="calls of spectrace's BEFORE/AFTER hooks in a serving engine")
    hook_seconds: float = Field(0.0, description="host time inside those hooks (the engine's own work excluded)")
    hook_seconds_by_feature: dict[str, float] = Field(
        default_factory=dict, description="hook_seconds split by patch-point feature (acceptance, graph_replay, ...)"
    )
    hook_calls_by_feature: dict[str, int] = Field(default_factory=dict, description="hook_calls split by feature")
    hook_slow_calls_by_feature: dict[str, int] = Field(
        default_factory=dict,
        description="calls over 100 us, by feature: the hook's thread lost the CPU or waited for the GIL",
    )
    hook_slow_seconds_by_feature: dict[str, float] = Field(
        default_factory=dict, description="the host time of those slow calls, by feature (part of hook_seconds_by_feature)"
    )
    once_counts: dict[str, int] = Field(
        default_factory=dict, description="occurrences of each record said once (its once_key), for keys seen more than once"
    )
    coverage_counts: dict[str, int] = Field(default_factory=dict, description="occurrences of each coverage note seen more than once")
    dropped_by_reason: dict[str, int] = Field(default_factory=dict, description="records_dropped split by why they were lost")


Record = Annotated[
    Union[Header, Call, Finding, Acceptance, Coverage, Weights, Capture, Fingerprint, Values, Counters],
    Field(discriminator="type"),
]
RECORD_ADAPTER: TypeAdapter[Any] = TypeAdapter(Record)
RECORD_TYPES = ("header", "call", "finding", "acceptance", "coverage", "weights", "capture", "fingerprint", "values", "counters")
# Names older writers used, still read: the closing record was "stats" before schema 2.
LEGACY_RECORD_TYPES = {"stats": "counters"}
