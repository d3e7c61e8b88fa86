"""What a trace's header says about its process: the command line (values redacted) and
the versions of the libraries that matter."""

from __future__ import annotations

import sys

from ..settings import REDACTED
from ..sinks.base import safe_text


def safe_argv(argv: list[str], keep_values: bool = False) -> list[str]:
    """The command line as the header stores it: program and option names, no values.

    A prompt, a token or a path passed on the command line would otherwise sit in every
    trace. ``argv[0]`` and ``--option`` names stay (they say how the server was started);
    every other token becomes ``<redacted>``. ``SPECTRACE_KEEP_ARGV=1`` keeps it all.
    Each token is made valid UTF-8 (:func:`~spectrace.sinks.base.safe_text`): a byte of a
    script name that is not UTF-8 must not cost the header, and with it the file.

        >>> safe_argv(["serve.py", "--prompt=hi there", "--port", "30000", "-v"])
        ['serve.py', '--prompt=<redacted>', '--port', '<redacted>', '-v']
    """
    if keep_values:
        return [safe_text(token) for token in argv]
    out = [safe_text(token) for token in argv[:1]]
    for token in argv[1:]:
        if token.startswith("--") and len(token) > 2:
            name, eq, _ = token.partition("=")
            out.append(safe_text(name) + (eq + REDACTED if eq else ""))
        elif token.startswith("-") and len(token) == 2 and not token[1].isdigit():
            out.append(safe_text(token))
        else:
            out.append(REDACTED)
    return out


def versions() -> dict[str, str]:
    """Python's version and those of torch, transformers and SGLang where imported."""
    found: dict[str, str] = {"python": sys.version.split()[0]}
    for name in ("torch", "transformers", "sglang"):
        module = sys.modules.get(name)
        version = getattr(module, "__version__", None) if module else None
        if version:
            found[name] = str(version)
    return found
