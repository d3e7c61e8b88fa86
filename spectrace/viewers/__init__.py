"""Terminal viewers for spectrace traces: load, derive a view model, render, diff.

Nothing here imports torch or the hooks, only :mod:`spectrace.records` and
:mod:`spectrace.rules.catalogue`, so ``spectrace view`` opens a trace in well under a second
on a machine with no GPU stack.

    >>> from spectrace.cli.view import main
    >>> main(["traces/", "--no-pager"])
    0
"""
