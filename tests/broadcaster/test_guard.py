"""The per-address connection count (broadcaster._guard.AddressSlots); the protocol
itself is tested on real sockets in tests/reliability/test_slowloris.py."""

from __future__ import annotations

from broadcaster._guard import AddressSlots


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
