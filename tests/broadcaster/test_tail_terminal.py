"""broadcaster._tail on a terminal (rich writing colours): the only escape sequences in
the trace of a hostile run are rich's own colours; what the run carried is shown as
text."""

from __future__ import annotations

import io
import re

from rich.console import Console

from broadcaster._tail import _Trace
from broadcaster.client import create_run_view, reconcile, reduce_run
from tests.support.hostile import controls, hostile_run, hostile_state

SGR = re.compile(r"\x1b\[[0-9;]*m")


def test_a_hostile_run_leaves_only_rich_colours_on_a_terminal() -> None:
    out = io.StringIO()
    trace = _Trace(Console(file=out, force_terminal=True, color_system="truecolor", width=200))
    view = create_run_view("s-1")
    for envelope in hostile_run("s-1", "x-1"):
        trace.envelope(envelope)
        view = reduce_run(view, envelope)
    trace.result(view, reconcile(view, hostile_state("x-1")), "")
    written = out.getvalue()
    assert SGR.search(written)  # rich did colour it
    assert controls(SGR.sub("", written)) == []
    assert "\x1b]8;" not in written  # no hyperlink, not even from the markup
    assert "[link=https://evil.example/]markup[/link]" in written
