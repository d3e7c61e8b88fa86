"""``spectrace replay``: feed a served draft's kept inputs to a reference draft built from its
checkpoint and name the first module whose output differs (see docs/replay.md).

- :mod:`.file`: the replay file kept beside a trace (``SPECTRACE_REPLAY``), its format;
- :mod:`.weights`: the checkpoint's tensors, read as ``spectrace audit`` reads them;
- :mod:`.reference`: spectrace's own EAGLE-3 reference draft, module by module;
- :mod:`.compare`: the served boundaries against the reference's, with dtype tolerances;
- :mod:`.run`: a replay from a trace folder to its result (the command line is
  :mod:`spectrace.cli.replay`).
"""
