"""The per-address connection count (broadcaster._guard.AddressSlots) and the request
target split; the protocol itself is tested on real sockets in
tests/reliability/test_slowloris.py."""

from __future__ import annotations

import random

import httptools
import pytest

from broadcaster._guard import AddressSlots, _split_target


def test_an_address_gets_at_most_its_limit() -> None:
    slots = AddressSlots(2)
    assert slots.take("10.0.0.1")
    assert slots.take("10.0.0.1")
    assert not slots.take("10.0.0.1")
    assert slots.take("10.0.0.2")
    assert slots.held("10.0.0.1") == 2


def test_a_closed_connection_gives_its_slot_back_and_nothing_is_kept() -> None:
    slots = AddressSlots(1)
    assert slots.take("10.0.0.1")
    slots.give_back("10.0.0.1")
    assert slots.held("10.0.0.1") == 0
    assert slots.take("10.0.0.1")
    slots.give_back("10.0.0.1")
    assert slots._open == {}


def test_zero_means_no_limit() -> None:
    slots = AddressSlots(0)
    assert all(slots.take("10.0.0.1") for _ in range(5000))


@pytest.mark.parametrize(
    "target",
    [
        b"/apps/a/events",
        b"/apps/a/events?",
        b"/apps/a/events?auth_key=k&auth_signature=abc",
        b"/apps/a/events?a=1?b=2",
        b"/apps/a%2Fb/events?x=%20",
        b"/apps/a/events#frag",
        b"/apps/a/events?a=b#frag?c",
        b"http://example.com/apps/a/events?a=b",
        b"//host/apps/a/events?a=b",
        b"*",
    ],
)
def test_a_request_target_splits_as_httptools_parses_it(target: bytes) -> None:
    parsed = httptools.parse_url(target)
    assert _split_target(target) == (parsed.path, parsed.query or b"")


def test_random_printable_targets_split_as_httptools_parses_them() -> None:
    """The HTTP parser lets through only printable ASCII in a target."""
    rng = random.Random(7)
    printable = bytes(range(33, 127))
    for _ in range(5000):
        target = b"/" + bytes(rng.choice(printable) for _ in range(rng.randint(0, 30)))
        try:
            parsed = httptools.parse_url(target)
        except httptools.HttpParserInvalidURLError:
            continue
        assert _split_target(target) == (parsed.path, parsed.query or b""), target
