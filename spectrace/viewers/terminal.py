"""What reaches a terminal: every string from a trace or a checkpoint goes through here.

A trace is untrusted input: its host, module names, finding messages and evidence are
written by whatever process made the file. Printed raw, an ESC sequence in one of them
would drive the terminal (recolour it, move the cursor, set the title, or write the
clipboard with OSC 52). :func:`printable` turns every control character into visible
text, and :class:`SafeConsole` applies it to every piece of text rich writes, so no
renderer can forget it; rich's own styling travels outside the text and is kept.
``--json`` output never goes through here: JSON escapes control characters itself.

    >>> printable("model.fc\\x1b]52;c;ZWNobyBoaQ==\\x07")
    'model.fc\\\\x1b]52;c;ZWNobyBoaQ==\\\\x07'
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from rich.console import Console, ConsoleOptions, RenderableType
from rich.segment import Segment

# C0 controls but newline and tab (layout, not commands), DEL, C1 controls (0x9b is a
# one-byte CSI), the bidirectional overrides that reorder what is shown, and lone
# surrogates (an undecodable file name; they would fail the write).
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` with every control character written out (``\\x1b``, ``\\x9b``, ``\\u202e``); idempotent."""
    return _UNSAFE.sub(_escape, text) if _UNSAFE.search(text) else text


def one_line(text: str) -> str:
    """:func:`printable`, and a newline or tab written out too: a name (a module's may hold
    one) shown in a cell or a line never breaks it."""
    return printable(text).replace("\n", "\\n").replace("\t", "\\t")


class SafeConsole(Console):
    """A rich console that escapes control characters in all the text it renders.

    Rich renders everything (tables, panels, trees, rules, the live display, the pager's
    buffer) through :meth:`render`; the text of each segment it yields is escaped there.
    Control segments (the live display's cursor moves) are rich's own and pass as they are.
    """

    def render(self, renderable: RenderableType, options: ConsoleOptions | None = None) -> Iterable[Segment]:
        for segment in super().render(renderable, options):
            if segment.control or not _UNSAFE.search(segment.text):
                yield segment
            else:
                yield Segment(printable(segment.text), segment.style, segment.control)


def safe_console(**kwargs: Any) -> SafeConsole:
    """A :class:`SafeConsole` (the arguments are rich ``Console``'s)."""
    return SafeConsole(**kwargs)


def write_line(stream: Any, line: str) -> None:
    """One line on ``stream`` (stderr), escaped and never raising (a closed stream says nothing)."""
    try:
        stream.write(printable(line.replace("\n", " ")) + "\n")
        stream.flush()
    except Exception:  # noqa: BLE001 - the exit status still tells
        pass
