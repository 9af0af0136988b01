"""The slow-consumer policy of a connection, tested directly on a recording socket:
the limit on unsent bytes, and the one message larger than the whole buffer that is
taken whole (the limit counting what is queued beyond it)."""

from __future__ import annotations

from broadcaster._frames import PreparedMessage
from broadcaster.connection import Delivery, QueuedConnection
from tests.support.hub import APP, recording_connection, tick

LIMIT = 1000


def message(size: int) -> PreparedMessage:
    """A message whose frame is ``size`` bytes (a 2- or 4-byte header included)."""
    return PreparedMessage(b"x" * (size - (2 if size < 128 else 4)))


async def test_unsent_bytes_over_the_limit_close_the_connection_with_4100() -> None:
    conn, raw = recording_connection("1.1", Delivery(LIMIT))
    conn.send(message(600))
    conn.send(message(400))
    assert conn.is_open
    conn.send(message(10))
    assert raw.closed_with == 4100
    assert raw.close_reason == f"slow consumer: more than {LIMIT} bytes unsent"


async def test_one_message_over_the_limit_is_taken_whole_and_the_limit_counts_beyond_it() -> None:
    """Behind up to the limit unsent: a message of five buffers is taken, then the limit's
    worth of others behind it, and only more than that closes."""
    conn, raw = recording_connection("1.1", Delivery(LIMIT))
    conn.send(message(300))
    conn.send(message(5 * LIMIT))
    conn.send(message(700))
    assert conn.is_open
    conn.send(message(10))
    assert raw.closed_with == 4100


async def test_a_second_message_over_the_limit_behind_the_first_closes_saying_why() -> None:
    conn, raw = recording_connection("1.1", Delivery(LIMIT))
    conn.send(message(2 * LIMIT))
    conn.send(message(3 * LIMIT))
    assert raw.closed_with == 4100
    assert raw.close_reason == (
        f"slow consumer: {2 * LIMIT} bytes unsent ahead of a {3 * LIMIT}-byte message "
        f"(max_buffer_bytes {LIMIT})"
    )


async def test_once_the_large_message_is_written_the_plain_limit_applies_again() -> None:
    conn, raw = recording_connection("1.1", Delivery(LIMIT))
    conn.send(message(3 * LIMIT))
    await tick()  # flushed: the kernel took it all
    conn.send(message(2 * LIMIT))  # a new one: nothing is unsent
    await tick()
    assert len(raw.written) == 5 * LIMIT
    conn.send(message(LIMIT))
    raw.backlog = LIMIT  # this one stays in the transport
    await tick()
    conn.send(message(10))
    assert raw.closed_with == 4100


async def test_over_the_limit_behind_more_than_the_limit_closes() -> None:
    """The message over the limit may wait behind at most the limit unsent."""
    conn, raw = recording_connection("1.1", Delivery(LIMIT))
    conn.send(message(LIMIT))
    await tick()
    raw.backlog = LIMIT + 1  # the transport has not sent it (nor the message before)
    conn.send(message(2 * LIMIT))
    assert raw.closed_with == 4100


class Queued(QueuedConnection):
    """A queued subscriber (as an SSE feed) whose close is recorded."""

    __slots__ = ("reason",)

    def _close_socket(self, code: int, reason: str, abort_after: float) -> None:
        self.reason = reason


async def test_a_queued_connection_takes_one_large_message_the_same_way() -> None:
    conn = Queued("1.2", APP, Delivery(LIMIT))
    conn.send(PreparedMessage(b"x" * 200))  # a queued connection counts payloads
    conn.send(PreparedMessage(b"x" * 4 * LIMIT))
    conn.send(PreparedMessage(b"x" * 800))
    assert conn.is_open
    assert conn.unsent() == 5 * LIMIT
    conn.send(PreparedMessage(b"x" * 4 * LIMIT))
    assert not conn.is_open
    assert conn.reason.startswith(f"slow consumer: {5 * LIMIT} bytes unsent ahead of")
    assert conn.unsent() == 0
