"""``spectrace probe``: which setting the served draft was trained with, from evidence.

Config rules and ``spectrace replay`` read the same config the engine read, so a draft
trained otherwise than its config says looks healthy to both. The probe measures instead:
the served draft's top-1 agreement with its target's own next-token choice, on the
served draft's kept inputs, as served and under each candidate setting (see docs/probe.md).

- :mod:`.rows`: pairs each kept draft forward with its target's choices, picks the rows;
- :mod:`.variants`: the candidates, each spectrace's reference draft with one setting changed;
- :mod:`.run`: a probe from a trace folder to its result (the command line is
  :mod:`spectrace.cli.probe`).
"""
