"""Server-provided text made safe for a terminal (safeguard reshard-126).

Op-log lines, server error messages and every other string the API sends can contain
anything a tenant, a store or a hostile server put there. Printed raw, an escape sequence could
retitle the operator's terminal (OSC ``ESC ] 0 ; … BEL``), clear it (``ESC [ 2 J``), move the
cursor to overwrite earlier lines (``\\r``, CSI), or, on terminals that honour them, write to
the clipboard or a file. :func:`clean` removes, before anything is printed:

- ESC sequences: CSI (``ESC [ … final``), OSC/DCS/SOS/PM/APC strings (up to ``BEL`` or ``ESC \\``,
  or to the end of the text when unterminated) and two-character escapes;
- their 8-bit C1 forms (``\\x9b`` CSI, ``\\x9d`` OSC, ``\\x90``/``\\x98``/``\\x9e``/``\\x9f``
  strings) and every other C1 control (U+0080 to U+009F);
- every C0 control and DEL, ``\\r`` included, except ``\\t`` (the CLI's tables separate their
  columns with it; a tab moves the cursor only forward) and ``\\n``, kept only with
  ``multiline=True`` (a printed block, e.g. an error listing several problems), never in one
  op-log line.

Every print of server-provided text in the CLI goes through :func:`clean` (JSON output needs
none: ``json.dumps`` escapes every control character). Cleaning happens before secret
scrubbing, so an escape inserted into a secret cannot hide it from the scrubber.
"""

from __future__ import annotations

import re

_ST = r"(?:\x07|\x1b\\|\x9c)"  # string terminators: BEL, ESC \, C1 ST
_SEQUENCES = re.compile(
    "|".join(
        (
            r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?",  # CSI (7- and 8-bit), final byte optional
            rf"(?:\x1b[\]PX^_]|[\x9d\x90\x98\x9e\x9f])(?:(?!{_ST})[\s\S])*{_ST}?",  # strings
            r"\x1b[ -/]*[0-~]?",  # other escapes (charset selection, keypad mode, ...)
        )
    )
)
_CONTROLS = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")
_CONTROLS_KEEP_NEWLINE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def clean(text: str, *, multiline: bool = False) -> str:
    """``text`` without terminal escape sequences and control characters (module rules)."""
    out = _SEQUENCES.sub("", text)
    return (_CONTROLS_KEEP_NEWLINE if multiline else _CONTROLS).sub("", out)
