"""Showing untrusted text: a short excerpt in error messages, never all of it; text a
model, a tool or a publisher wrote on a terminal or in a JSON line, with no control
characters the terminal would act on."""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["EXCERPT_LENGTH", "excerpt", "json_line", "printable"]

EXCERPT_LENGTH = 100
"""Characters of client input an error message may quote."""

# What a terminal acts on or a reader splits lines at: C0 (ESC starts every escape
# sequence: colours, titles, OSC 52 clipboard writes, OSC 8 hyperlinks, clear-screen),
# DEL, C1 (U+009B is a one-character CSI), the line and paragraph separators
# (str.splitlines() splits at them), and the bidirectional embeddings, overrides and
# isolates (they reorder what is shown).
_UNSAFE = "\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069"
_CONTROLS = re.compile(f"[\x00-\x08\x0a-\x1f{_UNSAFE}]")  # all but a tab
_CONTROLS_BUT_LINES = re.compile(f"[\x00-\x08\x0b-\x1f{_UNSAFE}]")
_JSON_UNSAFE = re.compile(f"[{_UNSAFE}]")  # json.dumps escapes C0 itself


def excerpt(value: object, limit: int = EXCERPT_LENGTH) -> str:
    """``repr`` of ``value`` (``str()`` of it), cut to ``limit`` characters with its
    full length noted.

    >>> excerpt("abc")
    "'abc'"
    >>> excerpt("x" * 5000, 4)
    "'xxxx'... (5000 characters)"
    """
    text = value if isinstance(value, str) else str(value)
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(value: object, *, lines: bool = False) -> str:
    """``str(value)`` with every control character shown as its escape (``\\x1b``,
    ``\\x9b``, ``\\u202e``) instead of acted on; a tab is kept, and with ``lines``
    (streamed text) line breaks too (``\\r\\n`` as ``\\n``).

    >>> printable("\\x1b]52;c;aGk=\\x07 ok\\tdone\\n")
    '\\\\x1b]52;c;aGk=\\\\x07 ok\\tdone\\\\x0a'
    >>> printable("one\\r\\ntwo\\x9b2J", lines=True)
    'one\\ntwo\\\\x9b2J'
    """
    text = value if isinstance(value, str) else str(value)
    if lines:
        return _CONTROLS_BUT_LINES.sub(_escaped, text.replace("\r\n", "\n"))
    return _CONTROLS.sub(_escaped, text)


def json_line(value: Any) -> str:
    """``value`` as one line of JSON (UTF-8 text kept) in which the control characters
    that JSON allows raw (DEL, C1, the line and paragraph separators, the bidirectional
    controls) are ``\\uXXXX`` escapes too: the same data, nothing a terminal acts on.

    >>> json_line({"text": "\\x9b2J\\u2028"})
    '{"text": "\\\\u009b2J\\\\u2028"}'
    """
    return _JSON_UNSAFE.sub(
        lambda m: f"\\u{ord(m.group()):04x}", json.dumps(value, ensure_ascii=False)
    )
