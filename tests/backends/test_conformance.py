"""The backend contract (``broadcaster.backends.base.Backend``), run against every
backend through the ``backend_factory`` fixture."""

from __future__ import annotations

import asyncio
import json

import pytest

from broadcaster.backends import BackendUnavailable, PresenceMember
from broadcaster.backends.base import Backend, PresenceFull
from broadcaster.publication import Position, Publication
from broadcaster.run_index import RunRecorder, RunSummary
from tests.backends.conftest import BackendFactory
from tests.backends.helpers import APP, OTHER_APP, Node, eventually, eventually_async


def pub(channel: str, data: str = "{}", app_id: str = APP, **extra: str) -> Publication:
    return Publication(app_id, channel, "agent.event", data, **extra)  # type: ignore[arg-type]


async def two_nodes(factory: BackendFactory, **options: object) -> tuple[Node, Node]:
    """Two nodes of one cluster (the same node twice for a single-node backend)."""
    first = await factory.node(**options)
    second = await factory.node(**options) if factory.multi_node else first
    return first, second


# -- delivery -----------------------------------------------------------------------------


async def test_publication_reaches_only_nodes_subscribed_to_its_channel(
    backend_factory: BackendFactory,
) -> None:
    publisher, subscriber = await two_nodes(backend_factory)
    await subscriber.backend.subscribe(APP, "chat")

    await publisher.backend.publish(pub("nobody-listens"))
    position = await publisher.backend.publish(pub("chat", '{"n":1}'))

    await subscriber.wait_for("chat")
    await subscriber.fence()
    assert [p.data for p in subscriber.on("chat")] == ['{"n":1}']
    assert subscriber.on("chat")[0].position == position
    assert subscriber.on("nobody-listens") == []
    if backend_factory.multi_node:
        await publisher.fence()
        assert {p.channel for p in publisher.publications} == {"fence"}


async def test_unsubscribe_stops_delivery(backend_factory: BackendFactory) -> None:
    publisher, subscriber = await two_nodes(backend_factory)
    await subscriber.backend.subscribe(APP, "chat")
    await publisher.backend.publish(pub("chat", "before"))
    await subscriber.wait_for("chat")

    await subscriber.backend.unsubscribe(APP, "chat")
    await subscriber.backend.unsubscribe(APP, "chat")  # idempotent
    await publisher.backend.publish(pub("chat", "after"))
    await subscriber.fence()

    assert [p.data for p in subscriber.on("chat")] == ["before"]


async def test_subscribe_is_idempotent(backend_factory: BackendFactory) -> None:
    node = await backend_factory.node()
    await node.backend.subscribe(APP, "chat")
    await node.backend.subscribe(APP, "chat")
    await node.backend.publish(pub("chat"))
    await node.fence()
    assert len(node.on("chat")) == 1


async def test_many_publications_arrive_in_order_with_consecutive_positions(
    backend_factory: BackendFactory,
) -> None:
    publisher, subscriber = await two_nodes(backend_factory)
    await subscriber.backend.subscribe(APP, "chat")

    positions = [await publisher.backend.publish(pub("chat", str(i))) for i in range(300)]

    await subscriber.wait_for("chat", 300)
    received = subscriber.on("chat")
    assert [p.data for p in received] == [str(i) for i in range(300)]
    assert [p.position for p in received] == positions
    assert positions[0] is not None
    epoch = positions[0].epoch
    assert positions == [Position(i + 1, epoch) for i in range(300)]


async def test_concurrent_publishes_are_delivered_in_position_order(
    backend_factory: BackendFactory,
) -> None:
    """The position and the delivery are assigned together, so delivery order is
    offset order even when publishes race."""
    publisher, subscriber = await two_nodes(backend_factory)
    await subscriber.backend.subscribe(APP, "chat")

    results = await asyncio.gather(*(publisher.backend.publish(pub("chat")) for _ in range(100)))

    await subscriber.wait_for("chat", 100)
    offsets = [p.position.offset for p in subscriber.on("chat") if p.position]
    assert offsets == list(range(1, 101))
    assert sorted(r.offset for r in results if r) == offsets


async def test_publish_without_history_has_no_position_and_is_not_kept(
    backend_factory: BackendFactory,
) -> None:
    node = await backend_factory.node()
    await node.backend.subscribe(APP, "chat")
    start = await node.backend.position(APP, "chat")

    assert await node.backend.publish(pub("chat", "volatile"), history=False) is None

    await node.wait_for("chat")
    assert node.on("chat")[0].position is None
    result = await node.backend.history(APP, "chat", start)
    assert result == type(result)((), recovered=True, position=start)


async def test_publication_fields_are_carried_through(backend_factory: BackendFactory) -> None:
    publisher, subscriber = await two_nodes(backend_factory)
    await subscriber.backend.subscribe(APP, "presence-room")
    sent = Publication(
        APP,
        "presence-room",
        "client-typing",
        '{"text":"h\\u00e9llo \\ud83d\\ude00","n":[1,2]}',
        exclude_socket_id="123.456",
        user_id="user-7",
    )
    start = await publisher.backend.position(APP, "presence-room")

    position = await publisher.backend.publish(sent)

    await subscriber.wait_for("presence-room")
    expected = Publication(
        sent.app_id, sent.channel, sent.event, sent.data, "123.456", "user-7", position
    )
    assert subscriber.on("presence-room") == [expected]
    history = await subscriber.backend.history(APP, "presence-room", start)
    assert history.publications == (expected,)


async def test_handler_failure_does_not_stop_delivery(backend_factory: BackendFactory) -> None:
    node = await backend_factory.node()
    record = node.on_publication

    def fail_on_boom(publication: Publication) -> None:
        if publication.data == "boom":
            raise RuntimeError("handler bug")
        record(publication)

    node.on_publication = fail_on_boom  # type: ignore[method-assign]
    await node.backend.stop()
    await node.backend.start(node.on_publication, node.on_control)
    await eventually(lambda: node.backend.ready, "the restarted backend to be ready")
    await node.backend.subscribe(APP, "chat")

    await node.backend.publish(pub("chat", "boom"))
    await node.backend.publish(pub("chat", "fine"))

    await node.wait_for("chat")
    assert [p.data for p in node.on("chat")] == ["fine"]


# -- history ------------------------------------------------------------------------------


async def test_history_since_a_position_returns_what_followed(
    backend_factory: BackendFactory,
) -> None:
    publisher, reader = await two_nodes(backend_factory)
    start = await reader.backend.position(APP, "chat")
    assert start.offset == 0
    positions = [await publisher.backend.publish(pub("chat", str(i))) for i in range(5)]
    assert positions[1] is not None
    assert positions[4] is not None
    assert start.epoch == positions[4].epoch

    after_second = await reader.backend.history(APP, "chat", positions[1])
    from_start = await reader.backend.history(APP, "chat", start)
    at_latest = await reader.backend.history(APP, "chat", positions[4])

    assert after_second.recovered
    assert [p.data for p in after_second.publications] == ["2", "3", "4"]
    assert [p.position for p in after_second.publications] == positions[2:]
    assert after_second.position == positions[4]
    assert from_start.recovered
    assert [p.data for p in from_start.publications] == ["0", "1", "2", "3", "4"]
    assert at_latest == type(at_latest)((), recovered=True, position=positions[4])
    assert await reader.backend.position(APP, "chat") == positions[4]


async def test_history_keeps_only_the_last_history_size_publications(
    backend_factory: BackendFactory,
) -> None:
    node = await backend_factory.node(history_size=3)
    positions = [await node.backend.publish(pub("chat", str(i))) for i in range(6)]
    assert positions[0] is not None
    assert positions[2] is not None

    trimmed = await node.backend.history(APP, "chat", positions[0])
    kept = await node.backend.history(APP, "chat", positions[2])

    assert not trimmed.recovered
    assert trimmed.publications == ()
    assert trimmed.position == positions[5]
    assert kept.recovered
    assert [p.data for p in kept.publications] == ["3", "4", "5"]


async def test_history_of_another_epoch_is_not_recovered(
    backend_factory: BackendFactory,
) -> None:
    node = await backend_factory.node()
    latest = await node.backend.publish(pub("chat"))
    assert latest is not None

    for since in (Position(0, "other-epoch"), Position(1, "other-epoch")):
        result = await node.backend.history(APP, "chat", since)
        assert result == type(result)((), recovered=False, position=latest)


async def test_history_from_a_future_offset_is_not_recovered(
    backend_factory: BackendFactory,
) -> None:
    node = await backend_factory.node()
    latest = await node.backend.publish(pub("chat"))
    assert latest is not None

    result = await node.backend.history(APP, "chat", Position(5, latest.epoch))

    assert not result.recovered
    assert result.position == latest


async def test_history_expires_after_history_ttl(backend_factory: BackendFactory) -> None:
    node = await backend_factory.node(history_ttl=0.2)
    first = await node.backend.publish(pub("chat", "0"))
    latest = await node.backend.publish(pub("chat", "1"))
    assert first is not None

    assert (await node.backend.history(APP, "chat", first)).recovered

    async def expired() -> bool:
        return not (await node.backend.history(APP, "chat", first)).recovered

    await eventually_async(expired, "the history to expire")
    # The epoch and offset outlive the history: nothing missed is still "recovered".
    at_latest = await node.backend.history(APP, "chat", latest)  # type: ignore[arg-type]
    assert at_latest.recovered
    assert at_latest.position == latest
    assert await node.backend.publish(pub("chat", "2")) == Position(3, first.epoch)


async def test_history_is_per_channel(backend_factory: BackendFactory) -> None:
    node = await backend_factory.node()
    a = await node.backend.publish(pub("a"))
    b = await node.backend.publish(pub("b"))
    assert a is not None
    assert b is not None
    assert a.offset == b.offset == 1
    assert (await node.backend.history(APP, "a", Position(0, a.epoch))).publications[0].channel == (
        "a"
    )


# -- presence -----------------------------------------------------------------------------


async def test_presence_member_added_once_and_removed_when_last_connection_leaves(
    backend_factory: BackendFactory,
) -> None:
    node = await backend_factory.node()
    alice = PresenceMember("alice", {"name": "Alice"})
    bob = PresenceMember("bob", None)
    backend = node.backend

    assert await backend.presence_add(APP, "presence-room", "1.1", alice) is True
    assert await backend.presence_add(APP, "presence-room", "1.2", alice) is False
    assert await backend.presence_add(APP, "presence-room", "1.2", alice) is False  # again
    assert await backend.presence_add(APP, "presence-room", "2.1", bob) is True
    members = await backend.presence_members(APP, "presence-room")
    assert sorted(members, key=lambda m: m.user_id) == [alice, bob]

    assert await backend.presence_remove(APP, "presence-room", "1.1") is None
    assert await backend.presence_remove(APP, "presence-room", "1.2") == alice
    assert await backend.presence_remove(APP, "presence-room", "1.2") is None  # idempotent
    assert await backend.presence_remove(APP, "presence-room", "9.9") is None  # unknown
    assert await backend.presence_members(APP, "presence-room") == [bob]
    assert await backend.presence_remove(APP, "presence-room", "2.1") == bob
    assert await backend.presence_members(APP, "presence-room") == []


@pytest.mark.multi_node
async def test_presence_is_shared_across_nodes(backend_factory: BackendFactory) -> None:
    first, second = await two_nodes(backend_factory)
    alice = PresenceMember("alice", {"n": 1})

    assert await first.backend.presence_add(APP, "presence-room", "1.1", alice) is True
    assert await second.backend.presence_add(APP, "presence-room", "2.1", alice) is False
    assert await second.backend.presence_members(APP, "presence-room") == [alice]

    assert await first.backend.presence_remove(APP, "presence-room", "1.1") is None
    assert await second.backend.presence_remove(APP, "presence-room", "2.1") == alice
    assert await first.backend.presence_members(APP, "presence-room") == []


@pytest.mark.multi_node
async def test_racing_nodes_announce_a_user_once(backend_factory: BackendFactory) -> None:
    first, second = await two_nodes(backend_factory)

    for i in range(20):
        member = PresenceMember(f"user-{i}")
        added = await asyncio.gather(
            first.backend.presence_add(APP, "presence-room", f"1.{i}", member),
            second.backend.presence_add(APP, "presence-room", f"2.{i}", member),
        )
        assert sorted(added) == [False, True]
        removed = await asyncio.gather(
            first.backend.presence_remove(APP, "presence-room", f"1.{i}"),
            second.backend.presence_remove(APP, "presence-room", f"2.{i}"),
        )
        assert sorted(removed, key=lambda m: m is not None) == [None, member]


# -- subscription counts ------------------------------------------------------------------


async def test_subscription_counts_are_summed_over_nodes(
    backend_factory: BackendFactory,
) -> None:
    first, second = await two_nodes(backend_factory)

    await first.backend.add_subscriptions(APP, "chat", 2)
    await second.backend.add_subscriptions(APP, "chat", 1)
    await second.backend.add_subscriptions(APP, "news", 1)
    assert await first.backend.subscription_counts(APP) == {"chat": 3, "news": 1}
    assert await second.backend.subscription_counts(APP) == {"chat": 3, "news": 1}
    # Of named channels only: an unoccupied one is left out, as in the full answer.
    assert await first.backend.subscription_counts(APP, ["chat", "idle"]) == {"chat": 3}
    assert await second.backend.subscription_counts(APP, ("news",)) == {"news": 1}
    assert await first.backend.subscription_counts(APP, []) == {}

    await first.backend.add_subscriptions(APP, "chat", -2)
    await second.backend.add_subscriptions(APP, "news", -1)
    assert await first.backend.subscription_counts(APP) == {"chat": 1}
    await second.backend.add_subscriptions(APP, "chat", -1)
    assert await first.backend.subscription_counts(APP) == {}


# -- connection counts --------------------------------------------------------------------


async def test_connection_counts_hold_an_apps_limit_on_every_node(
    backend_factory: BackendFactory,
) -> None:
    first, second = await two_nodes(backend_factory)
    assert [await first.backend.admit_connection(APP, 4) for _ in range(3)] == [True] * 3
    assert [await second.backend.admit_connection(APP, 4) for _ in range(2)] == [True, False]
    assert await second.backend.admit_connection(OTHER_APP, 1) is True, "apps count apart"

    await first.backend.release_connection(APP)
    assert await second.backend.admit_connection(APP, 4) is True
    assert await first.backend.admit_connection(APP, 4) is False


async def test_concurrent_admissions_on_two_nodes_never_exceed_the_limit(
    backend_factory: BackendFactory,
) -> None:
    first, second = await two_nodes(backend_factory)
    answers = await asyncio.gather(
        *(node.backend.admit_connection(APP, 7) for node in (first, second) * 15)
    )
    assert answers.count(True) == 7


@pytest.mark.multi_node
async def test_a_stopped_nodes_connections_stop_counting_at_once(
    backend_factory: BackendFactory,
) -> None:
    first, second = await two_nodes(backend_factory)
    assert await first.backend.admit_connection(APP, 2) is True
    assert await first.backend.admit_connection(APP, 2) is True
    assert await second.backend.admit_connection(APP, 2) is False

    await first.backend.stop()
    assert await second.backend.admit_connection(APP, 2) is True


# -- control ------------------------------------------------------------------------------


async def test_control_messages_reach_every_node(backend_factory: BackendFactory) -> None:
    first, second = await two_nodes(backend_factory)
    message = {"type": "terminate_connections", "user_id": "alice"}

    await first.backend.send_control(APP, message)

    for node in {id(n): n for n in (first, second)}.values():
        await eventually(lambda n=node: bool(n.controls), "the control message")  # type: ignore[misc]
        assert node.controls == [(APP, message)]


# -- isolation ----------------------------------------------------------------------------


async def test_apps_never_see_each_others_channels(backend_factory: BackendFactory) -> None:
    publisher, subscriber = await two_nodes(backend_factory)
    for app_id in (APP, OTHER_APP):
        await subscriber.backend.subscribe(app_id, "chat")

    one = await publisher.backend.publish(pub("chat", "for app1"))
    await publisher.backend.presence_add(APP, "presence-room", "1.1", PresenceMember("alice"))
    await publisher.backend.add_subscriptions(APP, "chat", 1)
    await publisher.backend.send_control(APP, {"type": "x"})
    await subscriber.fence(OTHER_APP)

    assert [p.data for p in subscriber.on("chat")] == ["for app1"]
    assert subscriber.on("chat", OTHER_APP) == []
    assert one is not None
    other_start = await subscriber.backend.position(OTHER_APP, "chat")
    assert other_start.offset == 0
    other = await subscriber.backend.history(OTHER_APP, "chat", Position(0, one.epoch))
    assert other.publications == ()
    assert await subscriber.backend.presence_members(OTHER_APP, "presence-room") == []
    assert await subscriber.backend.subscription_counts(OTHER_APP) == {}
    await eventually(lambda: bool(subscriber.controls), "the control message")
    assert [app for app, _ in subscriber.controls] == [APP]


@pytest.mark.multi_node
async def test_deployments_with_different_prefixes_never_cross(
    backend_factory: BackendFactory,
) -> None:
    ours = await backend_factory.node()
    theirs = await backend_factory.node(prefix=backend_factory.prefix + "-other")
    for node in (ours, theirs):
        await node.backend.subscribe(APP, "chat")

    mine = await ours.backend.publish(pub("chat", "ours"))
    await ours.backend.presence_add(APP, "presence-room", "1.1", PresenceMember("alice"))
    await ours.backend.add_subscriptions(APP, "chat", 1)
    await ours.backend.send_control(APP, {"type": "x"})
    await ours.wait_for("chat")
    await theirs.fence()

    assert theirs.on("chat") == []
    assert theirs.controls == []
    assert mine is not None
    assert (await theirs.backend.position(APP, "chat")).epoch != mine.epoch
    assert await theirs.backend.presence_members(APP, "presence-room") == []
    assert await theirs.backend.subscription_counts(APP) == {}


# -- lifecycle ----------------------------------------------------------------------------


async def test_ready_after_start_and_not_after_stop(backend_factory: BackendFactory) -> None:
    node = await backend_factory.node()
    assert node.backend.ready
    assert node.backend.node_id

    await node.backend.stop()
    await node.backend.stop()  # idempotent

    assert not node.backend.ready


async def test_publish_after_stop_raises_backend_unavailable(
    backend_factory: BackendFactory,
) -> None:
    node = await backend_factory.node()
    await node.backend.stop()
    with pytest.raises(BackendUnavailable, match="stopped"):
        await node.backend.publish(pub("chat"))


# -- stored values ------------------------------------------------------------------------


async def test_stored_values_are_seen_by_every_node(backend_factory: BackendFactory) -> None:
    writer, reader = await two_nodes(backend_factory)
    await writer.backend.store_value(APP, "state:s1", b'{"status":"completed"}', ttl=60)
    assert await reader.backend.load_value(APP, "state:s1") == b'{"status":"completed"}'
    assert await reader.backend.load_value(APP, "state:unknown") is None


async def test_stored_values_are_per_app(backend_factory: BackendFactory) -> None:
    node = await backend_factory.node()
    await node.backend.store_value(APP, "k", b"a", ttl=60)
    assert await node.backend.load_value(OTHER_APP, "k") is None


async def test_stored_values_expire(backend_factory: BackendFactory) -> None:
    node = await backend_factory.node()
    await node.backend.store_value(APP, "short", b"x", ttl=0.05)
    await eventually_async(lambda: _absent(node, "short"), "the value to expire")


async def _absent(node: Node, key: str) -> bool:
    return await node.backend.load_value(APP, key) is None


async def test_store_value_rejects_a_non_positive_ttl(backend_factory: BackendFactory) -> None:
    node = await backend_factory.node()
    with pytest.raises(ValueError, match="ttl must be a positive"):
        await node.backend.store_value(APP, "k", b"x", ttl=0)


async def test_latest_reads_a_position_without_creating_one(
    backend_factory: BackendFactory,
) -> None:
    node = await backend_factory.node()
    assert await node.backend.latest(APP, "never") is None
    assert await node.backend.latest(APP, "never") is None, "asking created nothing"
    handed_out = await node.backend.position(APP, "fresh")
    assert await node.backend.latest(APP, "fresh") == handed_out
    published = await node.backend.publish(pub("fresh"))
    assert await node.backend.latest(APP, "fresh") == published


async def test_history_of_an_unknown_channel_creates_nothing(
    backend_factory: BackendFactory,
) -> None:
    """A resume names any channel it likes: reading its history must not make the
    backend keep an epoch (a day) for a channel nobody published to."""
    node = await backend_factory.node()
    for since in (Position(0, "made-up"), Position(7, "other")):
        result = await node.backend.history(APP, "never-used", since)
        assert (result.recovered, result.publications, result.position) == (False, (), None)
    assert await node.backend.latest(APP, "never-used") is None


async def test_history_reads_page_by_page(backend_factory: BackendFactory) -> None:
    node = await backend_factory.node()
    start = await node.backend.position(APP, "chat")
    positions = [await node.backend.publish(pub("chat", str(n))) for n in range(5)]

    first = await node.backend.history(APP, "chat", start, limit=2)
    assert [p.data for p in first.publications] == ["0", "1"]
    assert first.recovered
    assert first.position == positions[-1]
    after = first.publications[-1].position
    assert after is not None
    rest = await node.backend.history(APP, "chat", after, limit=10)
    assert [p.data for p in rest.publications] == ["2", "3", "4"]
    assert rest.recovered


async def test_the_presence_limit_holds_under_concurrent_joins(
    backend_factory: BackendFactory,
) -> None:
    """150 users join at once through two nodes with a limit of 100: the check is part
    of the addition (one atomic step), so exactly 100 get in."""
    first, second = await two_nodes(backend_factory)

    async def join(n: int) -> bool:
        backend = (first, second)[n % 2].backend
        member = PresenceMember(f"user-{n}", {"n": n})
        try:
            await backend.presence_add(APP, "presence-crowd", f"{n}.1", member, limit=100)
        except PresenceFull:
            return False
        return True

    joined = await asyncio.gather(*(join(n) for n in range(150)))
    assert sum(joined) == 100
    assert len(await first.backend.presence_members(APP, "presence-crowd")) == 100
    again = PresenceMember("user-0" if joined[0] else f"user-{joined.index(True)}")
    assert (
        await second.backend.presence_add(APP, "presence-crowd", "9.9", again, limit=100) is False
    )


# -- claims (leases) ----------------------------------------------------------------------


async def test_a_claim_is_exclusive_across_nodes_until_released(
    backend_factory: BackendFactory,
) -> None:
    first, second = await two_nodes(backend_factory)
    assert await first.backend.claim_value(APP, "run:s1", "a", ttl=60)
    assert not await second.backend.claim_value(APP, "run:s1", "b", ttl=60)
    assert await first.backend.claim_value(APP, "run:s1", "a", ttl=60), "the owner renews"
    assert not await second.backend.release_value(APP, "run:s1", "b"), "not b's to release"
    assert not await second.backend.claim_value(APP, "run:s1", "b", ttl=60)
    assert await first.backend.release_value(APP, "run:s1", "a")
    assert await second.backend.claim_value(APP, "run:s1", "b", ttl=60)


async def test_a_claim_is_per_key_and_per_app(backend_factory: BackendFactory) -> None:
    node = await backend_factory.node()
    assert await node.backend.claim_value(APP, "run:s1", "a", ttl=60)
    assert await node.backend.claim_value(APP, "run:s2", "b", ttl=60)
    assert await node.backend.claim_value(OTHER_APP, "run:s1", "c", ttl=60)
    assert await node.backend.load_value(APP, "run:s1") is None, "claims are not values"


async def test_an_unrenewed_claim_expires(backend_factory: BackendFactory) -> None:
    first, second = await two_nodes(backend_factory)
    assert await first.backend.claim_value(APP, "run:s1", "dead", ttl=0.05)

    async def taken() -> bool:
        return await second.backend.claim_value(APP, "run:s1", "alive", ttl=60)

    await eventually_async(taken, "the dead owner's claim to expire")
    assert not await first.backend.release_value(APP, "run:s1", "dead")


async def test_every_node_reads_a_claims_holder_until_it_ends(
    backend_factory: BackendFactory,
) -> None:
    first, second = await two_nodes(backend_factory)
    assert await second.backend.claim_holder(APP, "session:s1") is None
    assert await first.backend.claim_value(APP, "session:s1", "nonce-1", ttl=60)
    assert await second.backend.claim_holder(APP, "session:s1") == "nonce-1"
    assert await second.backend.claim_holder(OTHER_APP, "session:s1") is None
    assert await first.backend.release_value(APP, "session:s1", "nonce-1")
    assert await second.backend.claim_holder(APP, "session:s1") is None
    assert await first.backend.claim_value(APP, "session:s1", "nonce-2", ttl=0.05)

    async def ended() -> bool:
        return await second.backend.claim_holder(APP, "session:s1") is None

    await eventually_async(ended, "the claim to expire")


async def test_claim_value_rejects_a_non_positive_ttl(backend_factory: BackendFactory) -> None:
    node = await backend_factory.node()
    with pytest.raises(ValueError, match="ttl must be a positive"):
        await node.backend.claim_value(APP, "k", "a", ttl=0)


# -- the run index (broadcaster.run_index) ------------------------------------------------


def envelope(kind: str, execution_id: str, payload: dict[str, object], ms: int = 0) -> str:
    return json.dumps(
        {
            "type": kind,
            "session_id": "s1",
            "execution_id": execution_id,
            "timestamp": f"2026-01-16T10:05:00.{ms:03d}Z",
            "payload": payload,
        }
    )


async def a_run(
    backend: Backend, channel: str, execution_id: str, *, chunks: int = 0, tools: int = 1
) -> None:
    """Publish one complete run's envelopes on ``channel``."""
    kinds: list[tuple[str, dict[str, object]]] = [
        ("agent.status", {"status": "in_progress"}),
        ("agent.step.started", {"step_number": 1}),
    ]
    kinds += [("agent.stream.chunk", {"chunk": "x" * 200, "chunk_index": i}) for i in range(chunks)]
    kinds += [
        ("agent.tool.started", {"tool_name": "t", "tool_call_id": f"c{i}"}) for i in range(tools)
    ]
    continuation = {"should_continue": False, "stop_reason": "done", "resolved_by": "Done"}
    kinds += [
        (
            "agent.step.completed",
            {
                "step_number": 1,
                "has_tool_calls": True,
                "duration_ms": 5,
                "continuation": continuation,
            },
        ),
        (
            "agent.status",
            {
                "status": "completed",
                "step_count": 1,
                "stop_reason": "done",
                "usage": {"prompt": 3, "completion": 4, "total": 7},
            },
        ),
    ]
    for i, (kind, payload) in enumerate(kinds):
        await backend.publish(
            Publication(APP, channel, kind, envelope(kind, execution_id, payload, i))
        )


async def test_a_run_is_indexed_as_running_then_with_its_summary_and_trace(
    backend_factory: BackendFactory,
) -> None:
    writer, reader = await two_nodes(backend_factory)
    runs = RunRecorder(writer.backend.runs, APP, ttl=60)
    await runs.started("agent.s1", "e1", input_text="what is " + "long " * 100)

    page, more = await reader.backend.runs.page(
        APP, before=None, start_min=None, start_max=None, count=10
    )
    assert more is None
    running = RunSummary.from_json(page[0].summary)
    assert (running.session_id, running.execution_id, running.status) == ("s1", "e1", "running")
    assert len(running.input_preview) == 200
    assert running.ended_at is None

    await a_run(writer.backend, "agent.s1", "e1")
    await runs.ended("agent.s1", "e1")

    [stored] = await reader.backend.runs.session_runs(APP, "agent.s1")
    done = RunSummary.from_json(stored)
    assert done.status == "completed"
    assert done.stop_reason == "done"
    assert done.resolved_by == "Done"
    assert done.steps == 1
    assert done.tool_calls == 1
    assert done.tokens == {"input": 3, "output": 4, "total": 7}
    assert done.started_at == running.started_at
    assert done.ended_at is not None
    latest = await reader.backend.latest(APP, "agent.s1")
    assert latest is not None
    assert done.first_position == str(Position(1, latest.epoch))
    assert done.last_position == str(latest)
    trace = json.loads(await reader.backend.runs.load_trace(APP, "agent.s1", "e1") or b"")
    assert trace["trimmed"] is False
    assert [e["envelope"]["type"] for e in trace["envelopes"]][-1] == "agent.status"
    assert trace["envelopes"][0]["position"] == done.first_position


async def test_index_pages_run_newest_first_with_a_cursor_and_a_start_range(
    backend_factory: BackendFactory,
) -> None:
    writer, reader = await two_nodes(backend_factory)
    runs = RunRecorder(writer.backend.runs, APP, ttl=60)
    for i in range(7):
        channel = "private-agent.p" if i == 3 else f"agent.s{i % 2}"
        await runs.started(channel, f"e{i}", started_at=1000.0 + i)
    await runs.started("agent.same", "z", started_at=1003.0)  # a tie with e3

    seen: list[str] = []
    before = None
    for _ in range(10):
        page, before = await reader.backend.runs.page(
            APP, before=before, start_min=None, start_max=None, count=3
        )
        seen += [RunSummary.from_json(run.summary).execution_id for run in page]
        if before is None:
            break
    assert seen == ["e6", "e5", "e4", "e3", "z", "e2", "e1", "e0"]  # e3's channel sorts last

    page, _ = await reader.backend.runs.page(
        APP, before=None, start_min=1_001_000, start_max=1_002_000, count=10
    )
    assert [RunSummary.from_json(r.summary).execution_id for r in page] == ["e2", "e1"]
    private = RunSummary.from_json(
        (await reader.backend.runs.session_runs(APP, "private-agent.p"))[0]
    )
    assert private.private
    assert private.session_id == "p"
    sessions = await reader.backend.runs.session_runs(APP, "agent.s0")
    assert [RunSummary.from_json(s).execution_id for s in sessions] == ["e0", "e2", "e4", "e6"]
    other, _ = await reader.backend.runs.page(
        OTHER_APP, before=None, start_min=None, start_max=None, count=10
    )
    assert other == []


async def test_a_trace_outlives_the_channel_history(backend_factory: BackendFactory) -> None:
    node = await backend_factory.node(history_ttl=0.3)
    runs = RunRecorder(node.backend.runs, APP, ttl=60)
    await runs.started("agent.s1", "e1")
    await a_run(node.backend, "agent.s1", "e1")
    await runs.ended("agent.s1", "e1")

    async def history_gone() -> bool:
        return not await node.backend.runs.kept(APP, "agent.s1")

    await eventually_async(history_gone, "the channel's history to expire")
    trace = json.loads(await node.backend.runs.load_trace(APP, "agent.s1", "e1") or b"")
    assert len(trace["envelopes"]) == 5
    assert trace["trimmed"] is False
    await runs.ended("agent.s1", "e1")  # ended again without history: the trace stays
    again = json.loads(await node.backend.runs.load_trace(APP, "agent.s1", "e1") or b"")
    assert again == trace


async def test_a_trace_over_its_bound_drops_stream_chunks_first_and_says_trimmed(
    backend_factory: BackendFactory,
) -> None:
    node = await backend_factory.node()
    runs = RunRecorder(node.backend.runs, APP, ttl=60, trace_bytes=2000)
    await runs.started("agent.s1", "e1")
    await a_run(node.backend, "agent.s1", "e1", chunks=20)
    await runs.ended("agent.s1", "e1")

    trace = json.loads(await node.backend.runs.load_trace(APP, "agent.s1", "e1") or b"")
    kinds = [e["envelope"]["type"] for e in trace["envelopes"]]
    assert trace["trimmed"] is True
    assert kinds[:2] == ["agent.status", "agent.step.started"]
    assert kinds[-1] == "agent.status"
    assert 0 < kinds.count("agent.stream.chunk") < 20
    assert sum(len(json.dumps(e["envelope"])) for e in trace["envelopes"]) <= 2000 * 1.1
