"""Offline pre-launch audit of an EAGLE-3 draft checkpoint against a serving engine.

    >>> from spectrace.audit.command import main
    >>> main(["tests/fixtures/speculators_tiny", "--target-config", "tests/fixtures/target_llama_config.json"])

``checkpoint`` reads untrusted files safely, ``engines`` models what each engine's draft
class expects, ``command`` is the CLI; the findings come from
:mod:`spectrace.checks.checkpoint`, as every finding comes from ``checks``.
"""
