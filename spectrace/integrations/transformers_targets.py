"""The modules the transformers and reference-pair integrations wait for (kept apart from
the patches: reading it must not import the runtime)."""

IMPORT_TARGETS: tuple[tuple[str, str], ...] = (
    ("transformers.modeling_utils", "spectrace.integrations.transformers:patch"),
    ("spectrace.eagle3.target", "spectrace.integrations.reference_pair:patch"),
    ("spectrace.eagle3.draft", "spectrace.integrations.reference_pair:patch"),
    ("spectrace.eagle3.loop", "spectrace.integrations.reference_pair:patch_loop"),
)
