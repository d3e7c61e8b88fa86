"""What every engine integration does the same way, written once.

An engine folder (``integrations/sglang``, ``integrations/vllm``) keeps only what is that
engine's own: its table of patch points, the facts its hooks gather and the checks they
call. Everything about *getting the hooks in* lives here, so that a fix reaches both
engines at once:

- ``points``: a patch point (dotted path -> hook) and an engine's table of them;
- ``marks``: the mark a spectrace wrapper carries, so nothing is patched twice;
- ``wrappers``: BEFORE / AFTER / AROUND wrappers and the per-thread re-entry guard;
- ``patcher``: applying points under one lock, classmethods and staticmethods included,
  at import time or now (``install_direct``);
- ``coverage``: what could not be patched, said loudly and once per feature;
- ``state``: where an engine's hooks send records, and forgetting what they learned;
- ``plugin``: an engine's plugin entry point (``SPECTRACE`` switch, the engine's plugin
  allowlist, once per process, never raising into the engine);
- ``package``: an engine package's lazy attributes;
- ``loads``: running an engine's weight load under spectrace's observer.

The core imports neither engine folder (``lint-imports`` holds it); engine folders import
the core. Nothing here imports torch or an engine at import time.
"""
