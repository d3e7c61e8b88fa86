"""What the pre-launch checks are told about a draft checkpoint and its target: plain facts.

The untrusted files are read in :mod:`spectrace.audit.checkpoint` (bounded reads, nothing
executed); what it found arrives here as these models, and the checks work on them alone,
so no check imports a file reader (or, through a ``.bin``, torch).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from ..rules.readings import Reading

Format = Literal["speculators", "sglang", "unknown"]


class TensorInfo(BaseModel):
    shape: list[int]
    dtype: str
    file: str
    # Absolute byte range of the data in a safetensors file (None for a torch pickle):
    # where read_vocab_maps may read a map's values, checked against the file's size.
    span: tuple[int, int] | None = None


class RopeKeys(BaseModel):
    """The rotary-embedding keys of one config.json as written, for :mod:`spectrace.checks.rope`
    to read the way the engine does (values type-checked, dicts bounded)."""

    where: str = Field("", description="the prefix of the config the model is built from: '', 'transformer_layer_config.', 'text_config.'")
    model_type: str = ""
    rope_theta: float | None = None
    rope_parameters: dict[str, Any] | None = None
    rope_scaling: dict[str, Any] | None = None
    partial_rotary_factor: float | None = None
    rope_is_neox_style: bool | None = None
    head_dim: int | None = None
    hidden_size: int | None = None
    num_attention_heads: int | None = None
    stray: dict[str, float] = Field(
        default={}, description="rope_theta values written where the engine builds nothing from (path -> value)"
    )


class VocabMaps(BaseModel):
    """The values of a draft checkpoint's vocabulary maps, where they could be read."""

    d2t: list[int] | None = Field(None, description="draft id i -> target id i + d2t[i]")
    t2d: list[bool] | None = Field(None, description="one flag per target id: is it in the draft vocabulary")
    notes: list[str] = Field(default=[], description="why a map's values were not read")


class DraftConfigFile(BaseModel):
    """The fields of a draft config.json that decide how an engine loads and feeds it."""

    format: Format
    architectures: list[str] = []
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    num_hidden_layers: int = 1
    draft_vocab_size: int | None = None
    target_hidden_size: int | None = None
    tie_word_embeddings: bool = False
    fc_bias: bool = Field(False, description="config.bias: SGLang gives fc a bias when set")
    top_level_ids: list[int] | None = Field(None, description="eagle_aux_hidden_state_layer_ids at the top level")
    eagle_config_ids: list[int] | None = Field(None, description="eagle_config.eagle_aux_hidden_state_layer_ids")
    use_aux_hidden_state: bool | None = None
    flags: dict[str, bool] = {}
    speculators_traces: list[str] = []
    null_keys: list[str] = Field(
        default=[], description="keys written as null that an engine reads with hasattr (so None is taken as the value)"
    )
    stated: Reading | None = Field(
        None, description="what the config states it was trained on (trainer_convention + trained_aux_boundaries or ids)"
    )
    rope: RopeKeys = RopeKeys()
    trained_with: str | None = Field(
        None, description="the trainer, when something says so for certain (--trained-with, the folder's record)"
    )
    trained_with_source: str = Field("", description="what said which trainer it was")
    eagle_config_keys: list[str] = Field(default=[], description="the keys eagle_config holds (a trainer's signature)")
    tensor_roots: list[str] = Field(
        default=[], description="the checkpoint's tensor name prefixes ('midlayer.', 'layers.', ...): a trainer's signature"
    )
    trained_rope_theta: float | None = Field(
        None, description="the base a record states the draft was trained with (the folder's record, trained_rope_theta)"
    )
    trained_rope_source: str = Field("", description="what stated trained_rope_theta")
    checksum_mismatches: list[str] = Field(
        default=[], description="files whose sha256 differs from checkpoint_sha256.txt (or that it names and are absent)"
    )


class TargetConfig(BaseModel):
    architectures: list[str] = []
    model_type: str = ""
    num_hidden_layers: int
    hidden_size: int
    vocab_size: int | None = None
    path: str = ""
    rope: RopeKeys | None = None


class DraftCheckpoint(BaseModel):
    path: str
    config: DraftConfigFile
    tensors: dict[str, TensorInfo]
    files: list[str]
    maps: VocabMaps = VocabMaps()
