"""The sans-I/O SSE decoders' limits: a line or an event's data longer than allowed is
refused while it is still being read, so a peer cannot grow memory without end."""

from __future__ import annotations

import pytest

from agent_core.drivers._sse import LineDecoder, SSEDecoder, SSELimitError


def test_line_decoder_splits_lf_crlf_and_cr_across_reads() -> None:
    lines = LineDecoder(100)
    assert lines.feed(b"a\nb\r") == ["a"]
    assert lines.feed(b"\nc\rd") == ["b", "c"]
    assert lines.feed(b"\xc3") == []
    assert lines.feed(b"\xa9\r\r") == ["dé"]
    assert lines.flush() == [""]
    assert lines.flush() == []


def test_line_decoder_refuses_a_long_line_complete_or_not() -> None:
    with pytest.raises(SSELimitError) as caught:
        LineDecoder(4).feed(b"12345\n")
    assert (caught.value.what, caught.value.limit) == ("a line", 4)
    lines = LineDecoder(4)
    assert lines.feed(b"1234") == []
    with pytest.raises(SSELimitError):
        lines.feed(b"5")


def test_sse_decoder_limits_the_data_of_one_event() -> None:
    decoder = SSEDecoder(max_data_length=7)
    assert decoder.feed_line("data: abc") is None
    assert decoder.feed_line("data: def") is None  # "abc\ndef": 7 characters
    with pytest.raises(SSELimitError, match="an event's data"):
        decoder.feed_line("data: g")
