"""The module the transformers integration waits for (kept apart from the patch: reading
it must not import the runtime)."""

IMPORT_TARGETS: tuple[tuple[str, str], ...] = (("transformers.modeling_utils", "spectrace.integrations.transformers:patch"),)
