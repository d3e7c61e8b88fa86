"""Offline pre-launch audit of an EAGLE-3 draft checkpoint against a serving engine.

    >>> from spectrace.cli.audit import main
    >>> main(["tests/fixtures/speculators_tiny", "--target-config", "tests/fixtures/target_llama_config.json"])

``checkpoint`` reads untrusted files safely into plain facts (:mod:`spectrace.checks.facts`),
``report`` and ``text`` lay out the result, ``trainer_record`` reads what the trainer wrote.
What each engine's draft class expects is a release rule (:mod:`spectrace.rules.engines`);
the findings come from :mod:`spectrace.checks.checkpoint`, as every finding comes from
``checks``; the command line is :mod:`spectrace.cli.audit`.
"""
