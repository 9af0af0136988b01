"""The hub's hardest logic, tested directly: fan-out, the seam between history and live
publications, gap filling, paged resume and leave-then-rejoin. A scripted backend and
recording connections; no server, no Redis."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator

import pytest

from broadcaster import _routes as routes
from broadcaster import hub as hub_module
from broadcaster import protocol
from broadcaster.backends.base import BackendUnavailable, HistoryResult
from broadcaster.backends.redis import resp
from broadcaster.backends.redis.resp import PubSubReader
from broadcaster.connection import Delivery
from broadcaster.hub import Hub, Resumed
from broadcaster.metrics import Metrics
from broadcaster.publication import Position, Publication
from tests.support.hub import (
    APP,
    RecordingSocket,
    ScriptedBackend,
    publication,
    pubsub_push,
    recording_connection,
    routed_reader,
    tick,
    with_routes,
)

CH = "agent.run"
APP_ID = APP.id


class EncodedHub(Hub):
    """Takes every live publication as the Redis backend hands it over: encoded, through
    :meth:`Hub.deliver_encoded` (its fast path, or the full one when it must)."""

    def deliver(self, publication: Publication) -> None:
        p = publication
        position = None if p.position is None else str(p.position)
        frame = protocol.channel_event(p.event, p.channel, p.data, p.user_id, position)
        self.deliver_encoded(p.app_id, p.channel, p.position, p.exclude_socket_id, frame)


class RoutedHub(Hub):
    """Takes every live publication as the Redis backend's pub/sub reader does: a
    ``message`` push read by a :class:`PubSubReader` that tries the direct routes first
    (:mod:`broadcaster._routes`), then the hub's encoded path."""

    _reader: PubSubReader | None = None

    def deliver(self, publication: Publication) -> None:
        table = self._routes
        assert table is not None  # made with a RoutedBackend
        if self._reader is None:
            self._reader = routed_reader(self, table)
        self._reader.data_received(pubsub_push(table, publication))


_hub_class: type[Hub] = Hub


@pytest.fixture(autouse=True, params=["objects", "encoded", "routed", "routed-python"])
def delivery_kind(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """Every test runs with publications delivered as objects, as encoded frames, and
    read from pub/sub pushes with direct routes (compiled, and their Python definition)."""
    global _hub_class
    _hub_class = {"objects": Hub, "encoded": EncodedHub}.get(request.param, RoutedHub)
    if request.param == "routed-python":
        monkeypatch.setattr(resp, "deliver", routes.py_deliver)
        monkeypatch.setattr(hub_module, "Route", routes.PyRoute)
    yield
    _hub_class = Hub


def make_hub(backend: ScriptedBackend, **options: int) -> Hub:
    if _hub_class is RoutedHub:
        backend = with_routes(backend)
    return _hub_class(backend, Metrics(), **options)  # type: ignore[arg-type]


def stream(*offsets: int, epoch: str = "e1") -> list:  # type: ignore[type-arg]
    return [publication(CH, n, epoch) for n in offsets]


async def test_one_publication_is_encoded_once_and_sent_to_every_subscriber_but_the_sender() -> (
    None
):
    backend = ScriptedBackend()
    hub = make_hub(backend)
    (a, raw_a), (b, raw_b), (c, raw_c) = (recording_connection(s) for s in ("1.1", "1.2", "1.3"))
    for conn in (a, b, c):
        await hub.subscribe(conn, CH)
    hub.deliver(publication(CH, 1, exclude_socket_id="1.3"))
    await tick()
    assert raw_a.written == raw_b.written != b""
    assert raw_c.written == b""
    assert backend.calls == [("subscribe", CH)]  # the backend subscribed once


async def test_a_resume_sends_the_history_then_the_held_live_ones_without_duplicate() -> None:
    """Live publications arriving while the history is read are held; at the seam the
    ones the history already sent are dropped and the newer ones follow, in order."""
    backend = ScriptedBackend(streams={CH: stream(1, 2, 3)})
    backend.gate["history"] = asyncio.Event()
    hub = make_hub(backend)
    conn, raw = recording_connection("1.1")
    await hub.subscribe(conn, CH, recovering=True)
    resume = asyncio.create_task(hub.resume(conn, CH, Position(0, "e1")))
    await tick()
    hub.deliver(publication(CH, 3))  # also in the history being read
    hub.deliver(publication(CH, 4))  # newer than the history read
    await tick()
    assert raw.offsets() == []  # held back while recovering
    backend.gate["history"].set()
    assert await resume == Resumed(True, Position(3, "e1"))
    await tick()
    assert raw.offsets() == [1, 2, 3, 4]


async def resumed_with_nothing_live(
    backend: ScriptedBackend,
) -> tuple[Hub, RecordingSocket, RecordingSocket]:
    """A hub where one subscriber resumed to the top of the history (1, 2) and one
    subscribed live, and nothing was delivered live yet (a dashboard that opened a
    run with the position ``POST /run`` gave it)."""
    hub = make_hub(backend)
    conn, raw = recording_connection("1.1")
    other, other_raw = recording_connection("1.2")
    await hub.subscribe(other, CH)
    await hub.subscribe(conn, CH, recovering=True)
    assert await hub.resume(conn, CH, Position(0, "e1")) == Resumed(True, Position(2, "e1"))
    return hub, raw, other_raw


async def test_after_a_resume_a_late_copy_of_the_last_history_publication_is_dropped() -> None:
    """With Redis, the pub/sub copy of a publication read from history can arrive after
    the resume: the seam drops it, and lets the next one through."""
    hub, raw, other_raw = await resumed_with_nothing_live(
        ScriptedBackend(streams={CH: stream(1, 2)})
    )
    hub.deliver(publication(CH, 2))  # the late copy
    hub.deliver(publication(CH, 3))
    hub.deliver(publication(CH, 4))
    await tick()
    assert raw.offsets() == [1, 2, 3, 4]
    assert other_raw.offsets() == [2, 3, 4]


def client_event(sender: str = "9.9") -> Publication:
    """A client event (or a presence notice): it has no position and is in no history."""
    return Publication(APP_ID, CH, "client-x", "{}", sender)


def received(raw: object) -> list[object]:
    """Each channel event's offset, and "c" for each client event, in order."""
    messages = raw.messages()  # type: ignore[attr-defined]
    return [json.loads(m["data"])["n"] if m["event"] == "step" else "c" for m in messages]


async def test_a_client_event_held_during_a_resume_does_not_undo_the_seam() -> None:
    """Held: [client event, copy of the last history publication, a newer one]. The
    client event is sent in its place, but it has no position, so the copy stays
    dropped (it once reset the seam: the copy went out twice after recovered: true)."""
    backend = ScriptedBackend(streams={CH: stream(1, 2, 3)})
    backend.gate["history"] = asyncio.Event()
    hub = make_hub(backend)
    conn, raw = recording_connection("1.1")
    await hub.subscribe(conn, CH, recovering=True)
    resume = asyncio.create_task(hub.resume(conn, CH, Position(0, "e1")))
    await tick()
    hub.deliver(client_event())
    hub.deliver(publication(CH, 3))  # also in the history being read
    hub.deliver(client_event("1.1"))  # its own: never sent back to it
    hub.deliver(publication(CH, 4))
    await tick()
    backend.gate["history"].set()
    assert await resume == Resumed(True, Position(3, "e1"))
    await tick()
    assert received(raw) == [1, 2, 3, "c", 4]


async def test_a_client_event_after_a_resume_keeps_the_seam_for_a_late_copy() -> None:
    """With Redis, the pub/sub copy of the last history publication can come after the
    resume, and a client event before it: the copy is still dropped."""
    backend = ScriptedBackend(streams={CH: stream(1, 2)})
    hub = make_hub(backend)
    conn, raw = recording_connection("1.1")
    await hub.subscribe(conn, CH, recovering=True)
    assert await hub.resume(conn, CH, Position(0, "e1")) == Resumed(True, Position(2, "e1"))
    hub.deliver(client_event())
    hub.deliver(publication(CH, 2))  # the late copy
    hub.deliver(publication(CH, 3))
    await tick()
    assert received(raw) == [1, 2, "c", 3]


async def test_a_resume_reads_a_long_history_page_by_page() -> None:
    backend = ScriptedBackend(streams={CH: stream(*range(1, 251))})
    hub = make_hub(backend)
    conn, raw = recording_connection("1.1")
    await hub.subscribe(conn, CH, recovering=True)
    assert await hub.resume(conn, CH, Position(0, "e1")) == Resumed(True, Position(250, "e1"))
    await tick()
    assert raw.offsets() == list(range(1, 251))
    reads = [call for call in backend.calls if call[0] == "history"]
    assert [(call[2].offset, call[3]) for call in reads] == [(0, 100), (100, 100), (200, 100)]


async def test_a_resume_from_a_trimmed_position_is_not_recovered_and_goes_live() -> None:
    backend = ScriptedBackend(streams={CH: stream(5, 6)}, trimmed={CH: 4})
    hub = make_hub(backend)
    conn, raw = recording_connection("1.1")
    await hub.subscribe(conn, CH, recovering=True)
    assert await hub.resume(conn, CH, Position(1, "e1")) == Resumed(False, Position(6, "e1"))
    hub.deliver(publication(CH, 7))
    await tick()
    assert raw.offsets() == [7]  # nothing from history, live again


async def test_a_resume_from_another_epoch_is_not_recovered() -> None:
    backend = ScriptedBackend(streams={CH: stream(1, 2, epoch="e2")})
    hub = make_hub(backend)
    conn, raw = recording_connection("1.1")
    await hub.subscribe(conn, CH, recovering=True)
    assert await hub.resume(conn, CH, Position(9, "e1")) == Resumed(False, Position(2, "e2"))
    await tick()
    assert raw.offsets() == []


async def test_a_failed_history_read_leaves_the_connection_held_for_the_caller() -> None:
    backend = ScriptedBackend(streams={CH: stream(1)}, fail={"history"})
    hub = make_hub(backend)
    conn, raw = recording_connection("1.1")
    await hub.subscribe(conn, CH, recovering=True)
    with pytest.raises(BackendUnavailable):
        await hub.resume(conn, CH, Position(0, "e1"))
    hub.deliver(publication(CH, 2))
    await tick()
    assert raw.offsets() == []  # still held: the node unsubscribes it and closes


async def test_held_publications_over_the_buffer_are_dropped_and_read_again() -> None:
    """A resume that holds more live publications than the buffer allows drops the ones
    kept in the history and reads them from there again: nothing lost, nothing twice."""
    backend = ScriptedBackend(streams={CH: stream(1)})
    backend.gate["history"] = asyncio.Event()
    hub = make_hub(backend, max_buffer_bytes=4096)
    conn, raw = recording_connection("1.1", Delivery(1 << 20))
    await hub.subscribe(conn, CH, recovering=True)
    resume = asyncio.create_task(hub.resume(conn, CH, Position(0, "e1")))
    await tick()
    live = stream(*range(2, 80))
    backend.append(CH, *live)
    for item in live:
        hub.deliver(item)
    backend.gate["history"].set()
    assert await resume == Resumed(True, Position(79, "e1"))
    await tick()
    assert raw.offsets() == list(range(1, 80))
    assert len([call for call in backend.calls if call[0] == "history"]) >= 2


async def test_a_gap_is_filled_from_the_history_before_the_publication_that_revealed_it() -> None:
    backend = ScriptedBackend(streams={CH: stream(1, 2, 3, 4, 5)})
    backend.gate["history"] = asyncio.Event()
    hub = make_hub(backend)
    conn, raw = recording_connection("1.1")
    await hub.subscribe(conn, CH)
    hub.deliver(publication(CH, 1))
    hub.deliver(publication(CH, 4))  # 2 and 3 were missed
    hub.deliver(publication(CH, 5))  # arrives while the gap is filled: held
    backend.gate["history"].set()
    await hub.drain_fills()
    hub.deliver(publication(CH, 6))
    await tick()
    assert raw.offsets() == [1, 2, 3, 4, 5, 6]
    assert ("history", CH, Position(1, "e1"), 100) in backend.calls  # a page, as a resume


async def test_live_copies_of_what_the_history_gave_are_dropped() -> None:
    """The history read went further than pub/sub had come: the live ones still on
    their way are copies."""
    backend = ScriptedBackend(streams={CH: stream(1, 2, 3, 4, 5, 6)})
    hub = make_hub(backend)
    conn, raw = recording_connection("1.1")
    await hub.subscribe(conn, CH)
    hub.deliver(publication(CH, 1))
    hub.deliver(publication(CH, 3))  # 2 was missed; the history has up to 6 already
    await hub.drain_fills()
    for n in (4, 5, 6, 7):
        hub.deliver(publication(CH, n))
    await tick()
    assert raw.offsets() == [1, 2, 3, 4, 5, 6, 7]


async def test_a_live_publication_at_an_offset_already_received_live_is_delivered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The store went back (it lost 4 and 5 and hands out their offsets again): the
    new 4 and 5 are other publications, not copies."""
    backend = ScriptedBackend()
    hub = make_hub(backend)
    conn, raw = recording_connection("1.1")
    await hub.subscribe(conn, CH)
    with caplog.at_level(logging.WARNING, logger="broadcaster.hub"):
        for n in (1, 2, 3, 4, 5, 4, 5, 6):
            hub.deliver(publication(CH, n))
    await tick()
    assert raw.offsets() == [1, 2, 3, 4, 5, 4, 5, 6]
    assert "hands out their offsets again" in caplog.text
    assert not [call for call in backend.calls if call[0] == "history"]


async def test_a_gap_the_history_no_longer_has_closes_the_subscribers_with_4100(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Not a silent gap: pusher-js reconnects after 4100 and resumes from its position
    (told ``recovered: false``)."""
    backend = ScriptedBackend(streams={CH: stream(3, 4, 5)}, trimmed={CH: 2})
    hub = make_hub(backend)
    conn, raw = recording_connection("1.1")
    other, other_raw = recording_connection("1.2")
    await hub.subscribe(conn, CH)
    await hub.subscribe(other, CH)
    hub.deliver(publication(CH, 1))
    with caplog.at_level(logging.WARNING, logger="broadcaster.hub"):
        hub.deliver(publication(CH, 4))  # 2 and 3 missed, 2 no longer in the history
        await hub.drain_fills()
    await tick()
    assert raw.offsets() == [1]
    assert raw.closed_with == other_raw.closed_with == 4100
    assert "missing from the history" in caplog.text
    assert len([call for call in backend.calls if call[0] == "history"]) == 1


async def test_a_failed_gap_fill_is_read_again_until_the_backend_answers() -> None:
    """A history read failing mid-failover is not an accepted gap."""
    backend = ScriptedBackend(streams={CH: stream(1, 2, 3, 4)}, failures={"history": 2})
    hub = make_hub(backend)
    conn, raw = recording_connection("1.1")
    await hub.subscribe(conn, CH)
    hub.deliver(publication(CH, 1))
    hub.deliver(publication(CH, 4))
    await hub.drain_fills()
    hub.deliver(publication(CH, 5))
    await tick()
    assert raw.offsets() == [1, 2, 3, 4, 5]
    assert raw.closed_with is None
    assert len([call for call in backend.calls if call[0] == "history"]) == 3


async def test_a_gap_fill_gives_up_after_its_attempts_and_closes_the_subscribers() -> None:
    backend = ScriptedBackend(streams={CH: stream(1, 2, 3, 4)}, fail={"history"})
    hub = make_hub(backend, fill_attempts=2)
    conn, raw = recording_connection("1.1")
    await hub.subscribe(conn, CH)
    hub.deliver(publication(CH, 1))
    hub.check_gaps()  # the backend reconnected, its history reads still fail
    await hub.drain_fills()
    await tick()
    assert raw.offsets() == [1]
    assert raw.closed_with == 4100
    assert len([call for call in backend.calls if call[0] == "history"]) == 2


async def test_live_publications_held_during_a_fill_are_bounded_and_read_again() -> None:
    """Held ones beyond max_buffer_bytes are dropped and read from the history: each
    publication is delivered once, in order."""
    backend = ScriptedBackend(streams={CH: stream(1, 2, 3)})
    backend.gate["history"] = asyncio.Event()
    hub = make_hub(backend, max_buffer_bytes=1000)
    conn, raw = recording_connection("1.1", Delivery(1 << 20))
    await hub.subscribe(conn, CH)
    hub.deliver(publication(CH, 1))
    hub.deliver(publication(CH, 3))  # 2 missed: a fill, held until the gate opens
    for n in range(4, 40):  # far more than 1000 bytes held
        backend.append(CH, publication(CH, n))
        hub.deliver(publication(CH, n))
    backend.gate["history"].set()
    await hub.drain_fills()
    hub.deliver(publication(CH, 40))
    await tick()
    assert raw.offsets() == list(range(1, 41))
    assert raw.closed_with is None


async def test_a_store_that_went_back_in_a_failover_is_no_gap_and_its_new_epoch_starts() -> None:
    """The promoted replica lacks 4 and 5, which this node delivered live: nothing is
    missing here; the next publication starts a new epoch (the scripts see another
    replication id) and is delivered as a start."""
    backend = ScriptedBackend(streams={CH: stream(1, 2, 3)})
    hub = make_hub(backend)
    conn, raw = recording_connection("1.1")
    await hub.subscribe(conn, CH)
    for n in (1, 2, 3, 4, 5):
        hub.deliver(publication(CH, n))
    hub.check_gaps()  # reconnected to the promoted replica
    await hub.drain_fills()
    hub.deliver(publication(CH, 1, epoch="e2"))
    hub.deliver(publication(CH, 2, epoch="e2"))
    await tick()
    assert raw.offsets() == [1, 2, 3, 4, 5, 1, 2]
    assert raw.closed_with is None


async def test_a_new_epoch_after_the_node_followed_a_failover_closes_with_4100(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The node left a primary that may still take publications (a manual failover:
    another node published there after this one moved): the new epoch cannot show where
    the old one ended, so its subscribers are closed to resume (``recovered: false``)
    instead of going on past a possible gap."""
    backend = ScriptedBackend()
    hub = make_hub(backend)
    conn, raw = recording_connection("1.1")
    await hub.subscribe(conn, CH)
    for n in (1, 2):
        hub.deliver(publication(CH, n))
    backend.breaks += 1  # followed +switch-master
    with caplog.at_level(logging.WARNING, logger="broadcaster.hub"):
        hub.deliver(publication(CH, 1, epoch="e2"))
    await tick()
    assert raw.offsets() == [1, 2]
    assert raw.closed_with == 4100
    assert "stopped reading the primary" in caplog.text


async def test_after_a_break_the_same_epoch_going_on_is_no_doubt() -> None:
    """Back on the same store (its epoch goes on in order): a later new epoch is a
    plain start again."""
    backend = ScriptedBackend()
    hub = make_hub(backend)
    conn, raw = recording_connection("1.1")
    await hub.subscribe(conn, CH)
    hub.deliver(publication(CH, 1))
    backend.breaks += 1
    hub.deliver(publication(CH, 2))
    hub.deliver(publication(CH, 1, epoch="e2"))
    await tick()
    assert raw.offsets() == [1, 2, 1]
    assert raw.closed_with is None


@pytest.mark.parametrize("kept", [(1, 2, 3), ()], ids=["went-back", "emptied"])
async def test_after_the_primary_died_a_store_that_lost_what_was_delivered_closes_at_once(
    kept: tuple[int, ...],
) -> None:
    """The node lost its connection to a primary that died (a break: Redis writes a
    publication's acknowledgement and its pub/sub copies separately, so the dead primary
    may have accepted one this node never got). The store it reconnected to lacks what
    it delivered (a promoted replica that lagged; a restart without persistence), so it
    cannot show whether more was accepted: the subscribers are closed with 4100 at
    once, not at the next publication, which may never come."""
    backend = ScriptedBackend(streams={CH: stream(*kept)})
    hub = make_hub(backend)
    conn, raw = recording_connection("1.1")
    await hub.subscribe(conn, CH)
    for n in (1, 2, 3, 4, 5):
        hub.deliver(publication(CH, n))
    backend.breaks += 1  # the pub/sub connection was lost
    hub.check_gaps()  # reconnected: to a promoted replica, or to a restarted Redis
    await hub.drain_fills()
    await tick()
    assert raw.offsets() == [1, 2, 3, 4, 5]
    assert raw.closed_with == 4100


@pytest.mark.parametrize("kept", [(1,), ()], ids=["went-back", "emptied"])
async def test_a_break_before_anything_was_delivered_live_still_doubts_the_resumed_top(
    kept: tuple[int, ...],
) -> None:
    """The resume's read of the top (2) is the channel's baseline until something is
    delivered live: the primary died at publication 3, which never came, and the store
    the node reconnected to lacks even 2. The subscribers are closed with 4100 (once
    they went on untold: the node had delivered nothing live, so it had no position to
    doubt)."""
    backend = ScriptedBackend(streams={CH: stream(1, 2)})
    hub, raw, other_raw = await resumed_with_nothing_live(backend)
    backend.streams[CH] = stream(*kept)
    backend.breaks += 1  # the pub/sub connection was lost
    hub.check_gaps()
    await hub.drain_fills()
    await tick()
    assert raw.offsets() == [1, 2]
    assert raw.closed_with == 4100
    assert other_raw.closed_with == 4100


async def test_a_new_epoch_after_a_break_before_anything_was_delivered_live_closes() -> None:
    backend = ScriptedBackend(streams={CH: stream(1, 2)})
    hub, raw, _ = await resumed_with_nothing_live(backend)
    backend.breaks += 1
    hub.deliver(publication(CH, 1, epoch="e2"))
    await tick()
    assert raw.offsets() == [1, 2]
    assert raw.closed_with == 4100


@pytest.mark.parametrize("noticed", ["live", "reconnected"])
async def test_publications_missed_after_a_resume_before_anything_live_are_filled(
    noticed: str,
) -> None:
    """Publication 3 was missed (the pub/sub connection dropped; Redis kept its data)
    before anything was delivered live: the next one, or the reconnection, reveals the
    gap after the resume's top, and the history fills it for every subscriber."""
    backend = ScriptedBackend(streams={CH: stream(1, 2)})
    hub, raw, other_raw = await resumed_with_nothing_live(backend)
    backend.append(CH, publication(CH, 3), publication(CH, 4))
    if noticed == "live":
        hub.deliver(publication(CH, 4))
    else:
        hub.check_gaps()
    await hub.drain_fills()
    await tick()
    assert raw.offsets() == [1, 2, 3, 4]
    assert other_raw.offsets() == [3, 4]
    assert raw.closed_with is None


async def test_a_gap_fill_after_a_break_that_finds_a_new_epoch_closes_with_4100() -> None:
    """The reconnection's fill reads the new primary: a new epoch there, after a break,
    is the same doubt as a live one."""
    backend = ScriptedBackend(streams={CH: stream(1, 2, epoch="e2")})
    hub = make_hub(backend)
    conn, raw = recording_connection("1.1")
    await hub.subscribe(conn, CH)
    hub.deliver(publication(CH, 5))
    backend.breaks += 1
    hub.check_gaps()
    await hub.drain_fills()
    await tick()
    assert raw.offsets() == [5]
    assert raw.closed_with == 4100


async def test_a_gap_fill_after_a_break_in_the_same_epoch_fills_it() -> None:
    backend = ScriptedBackend(streams={CH: stream(1, 2, 3)})
    hub = make_hub(backend)
    conn, raw = recording_connection("1.1")
    await hub.subscribe(conn, CH)
    hub.deliver(publication(CH, 1))
    backend.breaks += 1
    hub.check_gaps()
    await hub.drain_fills()
    hub.deliver(publication(CH, 1, epoch="e2"))  # recovered above: no doubt left
    await tick()
    assert raw.offsets() == [1, 2, 3, 1]
    assert raw.closed_with is None


async def test_the_start_of_a_new_epoch_is_filled() -> None:
    """The channel's history was lost and started again: what the new epoch published
    before this node noticed is read from its start."""
    backend = ScriptedBackend(streams={CH: stream(1, 2, 3, epoch="e2")})
    hub = make_hub(backend)
    conn, raw = recording_connection("1.1")
    await hub.subscribe(conn, CH)
    hub.deliver(publication(CH, 7, epoch="e1"))
    hub.deliver(publication(CH, 3, epoch="e2"))
    await hub.drain_fills()
    await tick()
    assert raw.offsets() == [7, 1, 2, 3]
    assert ("history", CH, Position(0, "e2"), 100) in backend.calls


async def test_check_gaps_fills_what_was_missed_at_the_end_of_a_stream() -> None:
    backend = ScriptedBackend(streams={CH: stream(1, 2, 3)})
    hub = make_hub(backend)
    conn, raw = recording_connection("1.1")
    await hub.subscribe(conn, CH)
    hub.deliver(publication(CH, 1))
    hub.check_gaps()  # the backend reconnected: 2 and 3 were published meanwhile
    await hub.drain_fills()
    await tick()
    assert raw.offsets() == [1, 2, 3]


async def test_a_large_gap_is_read_page_by_page_and_delivered_whole_and_in_order() -> None:
    """After an outage the whole missing range is not read at once: pages of a
    resume's size, each read in a slot of ``max_history_reads`` (the same bounds);
    what arrives live meanwhile follows, once."""
    backend = ScriptedBackend(streams={CH: stream(*range(1, 251))})
    hub = make_hub(backend, max_history_reads=1)
    conn, raw = recording_connection("1.1")
    await hub.subscribe(conn, CH)
    hub.deliver(publication(CH, 1))
    hub.check_gaps()  # reconnected: 2-250 were published meanwhile
    backend.append(CH, publication(CH, 251))
    hub.deliver(publication(CH, 251))  # live while the gap is filled: held
    await hub.drain_fills()
    await tick()
    assert raw.offsets() == list(range(1, 252))
    reads = [call for call in backend.calls if call[0] == "history"]
    assert [call[2].offset for call in reads] == [1, 101, 201]
    assert all(call[3] == 100 for call in reads)


async def test_a_gap_trimmed_away_between_pages_closes_the_subscribers_with_4100() -> None:
    """The history lost the next page while the first was delivered: told, not a gap."""

    class Trimming(ScriptedBackend):
        async def history(
            self, app_id: str, channel: str, since: Position, limit: int | None = None
        ) -> HistoryResult:
            page = await super().history(app_id, channel, since, limit)
            self.trimmed[channel] = 120  # the rest of the gap is trimmed away meanwhile
            return page

    backend = Trimming(streams={CH: stream(*range(1, 151))})
    hub = make_hub(backend)
    conn, raw = recording_connection("1.1")
    await hub.subscribe(conn, CH)
    hub.deliver(publication(CH, 1))
    hub.check_gaps()
    await hub.drain_fills()
    await tick()
    assert raw.offsets() == list(range(1, 102))
    assert raw.closed_with == 4100


async def test_gap_fills_after_a_reconnect_read_at_most_max_history_reads_at_once() -> None:
    channels = [f"agent.c{i}" for i in range(40)]
    backend = ScriptedBackend(
        streams={ch: [publication(ch, 1), publication(ch, 2)] for ch in channels}
    )
    gate = backend.gate["history"] = asyncio.Event()
    hub = make_hub(backend, max_history_reads=3)
    conns = []
    for i, ch in enumerate(channels):
        conn, raw = recording_connection(f"1.{i}")
        await hub.subscribe(conn, ch)
        hub.deliver(publication(ch, 1))
        conns.append(raw)
    hub.check_gaps()  # the backend reconnected: every channel reads what it missed
    await tick()
    reading = [c for c in backend.calls if c[0] == "history"]
    assert len(reading) == 3  # the others wait for a slot
    gate.set()
    await hub.drain_fills()
    await tick()
    assert all(raw.offsets() == [1, 2] for raw in conns)
    assert len([c for c in backend.calls if c[0] == "history"]) == 40


async def test_leaving_then_rejoining_during_the_backend_unsubscribe_ends_subscribed() -> None:
    """A quick leave-and-rejoin waits for the backend's unsubscribe before subscribing
    again, so the backend cannot end up unsubscribed while a client is there."""
    backend = ScriptedBackend()
    hub = make_hub(backend)
    conn, raw = recording_connection("1.1")
    await hub.subscribe(conn, CH)
    backend.gate["unsubscribe"] = asyncio.Event()
    leaving = asyncio.create_task(hub.unsubscribe(conn, CH))
    await tick()
    rejoin = asyncio.create_task(hub.subscribe(conn, CH))
    await tick()
    assert backend.calls == [("subscribe", CH), ("unsubscribe", CH)]  # waits for it
    backend.gate["unsubscribe"].set()
    assert await leaving
    await rejoin
    assert backend.calls == [("subscribe", CH), ("unsubscribe", CH), ("subscribe", CH)]
    hub.deliver(publication(CH, 1))
    await tick()
    assert raw.offsets() == [1]
    assert hub.subscriber_count(APP_ID, CH) == 1


async def test_leaving_before_the_backend_subscription_is_made_unsubscribes_after_it() -> None:
    backend = ScriptedBackend()
    backend.gate["subscribe"] = asyncio.Event()
    hub = make_hub(backend)
    first, _ = recording_connection("1.1")
    second, _ = recording_connection("1.2")
    joining = asyncio.create_task(hub.subscribe(first, CH))
    joining_too = asyncio.create_task(hub.subscribe(second, CH))
    await tick()
    assert await hub.unsubscribe(first, CH)
    assert await hub.unsubscribe(second, CH)
    backend.gate["subscribe"].set()
    # Both callers learn that the subscription did not stay (they had left anyway).
    outcomes = await asyncio.gather(joining, joining_too, return_exceptions=True)
    assert all(isinstance(outcome, BackendUnavailable) for outcome in outcomes)
    await tick()
    assert backend.calls == [("subscribe", CH), ("unsubscribe", CH)]
    assert hub.channels() == 0


async def test_a_failed_backend_subscription_is_raised_and_forgotten() -> None:
    backend = ScriptedBackend(fail={"subscribe"})
    hub = make_hub(backend)
    conn, _ = recording_connection("1.1")
    with pytest.raises(BackendUnavailable):
        await hub.subscribe(conn, CH)
    assert hub.channels() == 0
    backend.fail.clear()
    await hub.subscribe(conn, CH)  # a retry subscribes afresh
    assert hub.subscriber_count(APP_ID, CH) == 1


async def test_a_publication_without_position_goes_to_everyone_but_its_sender() -> None:
    """A client event has no position: it is neither ordered nor held for a gap."""
    hub = make_hub(ScriptedBackend())
    (a, raw_a), (b, raw_b) = (recording_connection(s) for s in ("1.1", "1.2"))
    for conn in (a, b):
        await hub.subscribe(conn, CH)
    hub.deliver(publication(CH, 1))
    event = Publication(APP_ID, CH, "client-typing", '{"who":"b"}', exclude_socket_id="1.2")
    hub.deliver(event)
    hub.deliver(Publication(APP_ID, "agent.nobody-listens", "step", "{}"))
    await tick()
    assert raw_a.written.count(b"client-typing") == 1
    assert b"client-typing" not in raw_b.written
    assert raw_a.offsets() == raw_b.offsets() == [1]
