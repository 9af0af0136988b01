"""The Redis key layout and payload pieces, without Redis (``broadcaster.backends.redis.
layout``, ``codec``, ``scripts``): one hash-tagged layout for every topology."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from redis.crc import key_slot

from broadcaster.backends.base import new_epoch
from broadcaster.backends.redis import codec, layout, scripts
from broadcaster.backends.redis.core import PendingPublication, pending_publication
from broadcaster.backends.redis.publish import PublishPacker, publish_script_args
from broadcaster.backends.redis.resp import pack_commands
from broadcaster.protocol import channel_event
from broadcaster.publication import Position, Publication


def test_a_channels_keys_and_pubsub_channel_share_one_slot() -> None:
    kinds = ("pub", "meta", "stream", "presence")
    names = [layout.channel_key("P", "A", "agent.s1", kind) for kind in kinds]
    assert names[1] == "P:{A:agent.s1}:meta"
    assert len({key_slot(name.encode()) for name in names}) == 1


def test_an_apps_keys_share_one_slot_claims_included() -> None:
    names = [
        layout.control_channel("P", "A"),
        layout.app_key("P", "A", "subs", "node-1"),
        layout.app_key("P", "A", "subs-nodes"),
        layout.app_key("P", "A", "conn-counts"),
        layout.app_key("P", "A", "conn-nodes"),
        layout.claim_key("P", "A", "run:s1"),
    ]
    assert names[0] == "P:{A}:#control"
    assert len({key_slot(name.encode()) for name in names}) == 1


def test_the_publish_scripts_arguments_are_its_keys_and_the_frames_pieces() -> None:
    """KEYS are the channel's meta and stream; the frame's end and the pub/sub command
    are arguments, so one script serves every topology."""
    p = Publication("A", "chat", "ev", '{"x":1}', user_id="u1")
    keys, args = publish_script_args("P", p, 10, 1.0, 2.0, "ep", sharded=True)
    assert keys == ("P:{A:chat}:meta", "P:{A:chat}:stream")
    assert args[0] == "P:{A:chat}:pub"
    assert args[-2:] == (b'"}', "SPUBLISH")
    assert publish_script_args("P", p, 10, 1.0, 2.0, "ep")[1][-1] == "PUBLISH"
    # What the script assembles is the protocol's channel event, position included.
    before, after = codec.script_payload(p)
    payload = before + b"7 ep" + after + b"ep:7" + args[-2]
    *_, frame = codec.split_payload(payload)
    assert frame == channel_event("ev", "chat", '{"x":1}', "u1", Position(7, "ep"))
    assert orjson.loads(frame)["position"] == "ep:7"


def test_the_scripts_read_no_key_they_do_not_declare() -> None:
    """Written for one slot: no heartbeat key read by name (``EXISTS ARGV..``), no frame
    layout inside the Lua."""
    for name in scripts.__all__:
        script = getattr(scripts, name)
        if isinstance(script, scripts.Script):
            assert "EXISTS" not in script.source, name
    assert '"}' not in scripts.PUBLISH.source


def test_the_packer_packs_what_pack_commands_packs() -> None:
    """PublishPacker's EVALSHA is byte for byte the packed publish_script_args command,
    the channel's cached head included (each publication twice)."""
    publications = [
        Publication("app", "agent.s1", "agent.stream.chunk", '{"t":"\u00e9\\"x"}'),
        Publication("app", "agent.s1", "ev", "d", exclude_socket_id="123.456"),
        Publication("app", "presence-room", "client-ev", "{}", user_id="u1"),
        Publication("other", "agent.s1", "ev", ""),
    ]
    for sharded in (False, True):
        packer = PublishPacker("bc", 100, 300.0, 86_400.5, sharded=sharded)
        for p in publications * 2:
            keys, args = publish_script_args(
                "bc", p, 100, 300.0, 86_400.5, "0a1b2c3d", sharded=sharded
            )
            expected = pack_commands([("EVALSHA", scripts.PUBLISH.sha, len(keys), *keys, *args)])
            assert packer.evalsha(p, "0a1b2c3d") == expected


@pytest.mark.parametrize("socket_id", ["", "1 2", "1\n2"])
def test_the_packer_refuses_what_the_codec_refuses(socket_id: str) -> None:
    p = Publication("app", "agent.s1", "ev", "d", exclude_socket_id=socket_id)
    with pytest.raises(ValueError, match="socket id") as codec_error:
        codec.script_payload(p)
    with pytest.raises(ValueError, match="socket id") as packer_error:
        PublishPacker("bc", 100, 300.0, 86_400.0).evalsha(p, "0a1b2c3d")
    assert str(packer_error.value) == str(codec_error.value)


def test_epochs_are_distinct_8_hex_digits() -> None:
    epochs = [new_epoch() for _ in range(1000)]
    assert len(set(epochs)) == len(epochs)
    assert all(len(e) == 8 and int(e, 16) >= 0 for e in epochs)


async def test_a_pending_publication_made_fast_is_one_like_any_other() -> None:
    done: asyncio.Future[Position | None] = asyncio.get_running_loop().create_future()
    publication = Publication("app", "chat", "ev", "{}")
    made = pending_publication(publication, False, done)
    assert type(made) is PendingPublication
    assert made == PendingPublication(publication, False, done)
    assert (made.publication, made.history, made.done) == (publication, False, done)
    with pytest.raises(AttributeError):
        made.history = True  # type: ignore[misc]


def test_a_position_from_a_reply_is_a_position_like_any_other() -> None:
    for epoch in (b"abcdefgh", "abcdefgh"):
        position = codec.position_of([7, epoch])
        assert type(position) is Position
        assert position == Position(7, "abcdefgh")
