"""The named module profiles: which module names a trace hooks when no list is given.

A profile is a list of globs in the dialect of :mod:`.globs`. Torch-free, so that
``spectrace settings`` can say what a traced program will hook without loading torch.

    >>> PROFILES["hf"]
    ('**.embed_tokens', '**.layers.*', '**.norm', '**.lm_head')
"""

from __future__ import annotations

# A Hugging Face causal LM: embeddings, every decoder layer, the final norm, the head.
HF_CAUSAL_LM = ("**.embed_tokens", "**.layers.*", "**.norm", "**.lm_head")
# EAGLE-3 adds the draft's fc, its decoder layer under either name, and the aux concat.
EAGLE3 = HF_CAUSAL_LM + ("**.fc", "**.midlayer", "**.aux_concat", "**.hidden_norm")

# One default for every entry point (trace(), SPECTRACE=1, the pytest fixture): a model
# that is not a draft has no fc or midlayer, so the EAGLE-3 globs cost it nothing.
DEFAULT_PROFILE = "eagle3"  # what SPECTRACE_PROFILE unset means; "default" names it too
PROFILES: dict[str, tuple[str, ...]] = {
    "default": EAGLE3,
    "hf": HF_CAUSAL_LM,
    "eagle3": EAGLE3,
    "all": ("**",),
}


def modules_in_effect(modules: list[str] | tuple[str, ...], profile: str) -> tuple[list[str], str]:
    """The globs a traced program hooks under these settings, and where they come from
    (``SPECTRACE_MODULES`` and ``SPECTRACE_PROFILE`` add up; neither set: the default)."""
    found = list(modules)
    sources = ["SPECTRACE_MODULES"] if modules else []
    if profile:
        found.extend(PROFILES.get(profile, ()))
        sources.append(f"profile {profile!r}")
    if not found:
        return list(PROFILES[DEFAULT_PROFILE]), f"profile {DEFAULT_PROFILE!r}, the default"
    return found, " + ".join(sources)
