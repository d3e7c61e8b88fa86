"""What the engine built from the user's shrunk configs: facts read off its objects.

The records (capture, weights, findings) say the rest; these are the facts a server
shows only in its objects: the classes, the rotary each attention was built with, the
fused width handed to the draft, the config keys the draft's class read, the vocabulary
map it built. Pydantic: ``spectrace doctor --json`` writes them.
"""

from __future__ import annotations

from pydantic import BaseModel, Field


class Rotary(BaseModel):
    """One rotary embedding as the engine built it."""

    module: str
    cls: str
    base: float
    rope_type: str
    factor: float | None = None
    rotary_dim: int
    neox: bool


class BuiltModel(BaseModel):
    """A model the engine built: its config's architectures as the engine read them, the class."""

    architectures: list[str] = Field(description="the architectures after the engine's config loading (a draft's may be renamed)")
    config_architectures: list[str] = Field(default=[], description="the architectures the config.json names")
    cls: str = Field(description="the class the engine's loader built")
    rotaries: list[Rotary] = []


class EngineFacts(BaseModel):
    engine: str
    engine_version: str
    target: BuiltModel
    draft: BuiltModel
    capture_ids: list[int] | None = Field(description="the ids the engine resolved from the draft's config and passed to the target")
    fused_width: int | None = Field(description="the width of the hidden states the target handed the draft (tiny widths)")
    fc_in_features: int | None = Field(description="the width the draft's fc expects (tiny widths)")
    tiny_hidden: int = Field(description="the target's hidden size in the shrunk run")
    flags_set: list[str] = Field(default=[], description="training flags the draft's config sets")
    flags_read: list[str] = Field(default=[], description="those of the watched keys the draft's class read")
    hot_token_ids: list[int] | None = Field(None, description="the first target ids of the vocabulary map the engine built")
    hot_token_count: int | None = None
    embed_head: str | None = Field(None, description="the worker's step giving the draft the target's embedding (and head)")
    cpu_repacked: list[str] = Field(
        default=[],
        description="draft parameters the engine's CPU build repacked after load (its CPU GEMM): no replaced-weights finding for these",
    )
    steps: list[str] = []
    notes: list[str] = []
