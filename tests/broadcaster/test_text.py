"""broadcaster._text: untrusted text shown on a terminal or in a JSON line carries no
control character a terminal acts on, and a JSON line still holds the very text."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from broadcaster._text import json_line, printable
from tests.support.hostile import HOSTILE, controls

# Every code point class that matters: C0, DEL, C1, separators, bidi controls, text.
texts = st.text(
    st.characters(codec="utf-8")
    | st.sampled_from("\x00\x07\x08\t\n\r\x1b\x7f\x85\x9b\x9c\u2028\u2029\u202e\u2066")
)


def test_every_control_character_is_shown_as_its_escape() -> None:
    shown = printable(HOSTILE)
    assert controls(shown, newlines=False) == []
    assert shown.startswith("\\x1b]52;c;ZXZpbA==\\x07\\x1b]0;pwned\\x07\\x1b[2J")
    assert "\\x9b31m\\x90qsixel\\x9c\\x0d\\x08\\x07\\x7f\\x85\\u2028\\u202e[link=" in shown


def test_streamed_text_keeps_its_line_breaks_and_tabs() -> None:
    assert printable("a\r\nb\tc\rd\x1b[2K", lines=True) == "a\nb\tc\\x0dd\\x1b[2K"
    assert printable("a\nb\tc") == "a\\x0ab\tc"  # a one-line field: the break is shown


@given(texts)
def test_printable_text_has_no_control_character(text: str) -> None:
    assert controls(printable(text), newlines=False) == []
    assert controls(printable(text, lines=True)) == []


@given(st.dictionaries(texts, texts | st.lists(texts, max_size=3), max_size=4))
def test_a_json_line_is_one_line_without_controls_and_parses_back(value: object) -> None:
    line = json_line(value)
    assert controls(line, newlines=False) == []
    assert line.splitlines() == [line]
    assert json.loads(line) == value


def test_json_writes_c1_controls_raw_which_a_json_line_escapes() -> None:
    """Why json_line: json.dumps (orjson too) leaves DEL, C1 and U+2028 as they are."""
    raw = json.dumps({"t": "\x9b2J\x7f\u2028"}, ensure_ascii=False)
    assert controls(raw) == ["\x9b", "\x7f", "\u2028"]
    assert json_line({"t": "\x9b2J\x7f\u2028"}) == '{"t": "\\u009b2J\\u007f\\u2028"}'
