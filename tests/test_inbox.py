"""The receive side's bounds without sockets: budgets (per connection and per node), the
inbox between the frame decoders and ``recv()``, frames held before the HELLO, and the
settings that configure them."""

from __future__ import annotations

import dataclasses
import gc

import pytest
import zstandard
from conftest import run

from iac.errors import ConfigError, ConnectionClosed, ProtocolError
from iac.transport.base import TransportConfig
from iac.transport.budget import MemoryBudget, RecvBudget
from iac.transport.queues import Inbox
from iac.transport.session import EarlyFrames, PeerGoaway, SessionLogic
from iac.wire.dicts import DictionarySet
from iac.wire.frames import FLAG_ZSTD, FrameDecoder, FrameType, PackedFrame, encode_frame
from iac.wire.scan import encode_varint

MiB = 1 << 20


def bomb(size: int = 4 * MiB) -> PackedFrame:
    """A MESSAGE of ~150 bytes on the wire that decompresses to ``size`` bytes."""
    body = zstandard.ZstdCompressor(write_content_size=True).compress(bytes(size))
    return FrameDecoder().feed_packed(
        bytes((FrameType.MESSAGE, FLAG_ZSTD)) + encode_varint(len(body)) + body
    )[0]


def raw(n: int, ftype: FrameType = FrameType.MESSAGE) -> PackedFrame:
    return FrameDecoder().feed_packed(encode_frame(ftype, b"m" * n))[0]


class Fixture:
    def __init__(self, *, conn: int = 16 * MiB, node: int = 64 * MiB, frames: int = 1024) -> None:
        self.node = MemoryBudget(node)
        self.rooms = 0
        self.faults: list[ProtocolError] = []
        self.inbox = Inbox(
            max_frames=frames,
            budget=RecvBudget(conn, self.node),
            dictionaries=DictionarySet(),
            batch_bytes=4 * MiB,
            on_room=self.room,
            on_fault=self.faults.append,
        )
        self.logic = SessionLogic("peer")

    def room(self) -> None:
        self.rooms += 1

    def pump(self) -> int:
        """Judge what fits; return how many frames were queued."""
        queued = 0
        while (frame := self.inbox.next_frame()) is not None:
            result = self.logic.judge(frame)
            self.inbox.judged(frame, keep=result is not None and not isinstance(result, PeerGoaway))
            queued += result is not None
        return queued


def test_frames_wait_compressed_and_count_decompressed() -> None:
    async def main() -> None:
        f = Fixture(conn=16 * MiB + 64 * 1024)  # (the unjudged frames' wire bytes count too)
        f.inbox.arrived([bomb() for _ in range(100)])
        assert f.node.used == 100 * bomb().wire_size  # arrived: their wire bytes
        assert f.pump() == 4  # 16 MiB of decompressed budget: four of them
        assert f.inbox.blocked and len(f.inbox) == 4 and len(f.inbox.backlog) == 96
        assert f.inbox.budget.held <= 16 * MiB + 64 * 1024
        got = await f.inbox.get_many(32)  # one 4 MiB frame per call: batch_bytes
        assert len(got) == 1 and got[0].frame.body == bytes(4 * MiB)
        assert f.pump() == 0  # what was handed out counts until the next call
        await f.inbox.get_many(32)
        assert f.pump() == 1

    run(main())


def test_small_frames_are_handed_out_in_batches() -> None:
    async def main() -> None:
        f = Fixture()
        f.inbox.arrived([raw(100) for _ in range(50)])
        assert f.pump() == 50
        got = await f.inbox.get_many(32)
        assert len(got) == 32 and all(inc.frame.body == b"m" * 100 for inc in got)
        assert len(await f.inbox.get_many(32)) == 18
        assert f.inbox.budget.held == sum(raw(100).cost for _ in range(18))

    run(main())


def test_a_connection_waits_for_the_node_budget_and_is_called_back() -> None:
    async def main() -> None:
        node = MemoryBudget(8 * MiB + 4096)  # two frames, and the third's wire bytes
        a, b = Fixture(), Fixture()
        for f in (a, b):
            f.node = node
            f.inbox.budget = RecvBudget(8 * MiB, node)
        a.inbox.arrived([bomb(), bomb()])
        b.inbox.arrived([bomb()])
        assert a.pump() == 2  # the node's 8 MiB
        assert b.pump() == 0 and b.inbox.blocked
        await a.inbox.get_many(1)
        await a.inbox.get_many(1)  # gives the first back: b is called back
        assert b.rooms == 1 and b.pump() == 1

    run(main())


def test_nothing_returnable_means_the_frame_goes_through() -> None:
    """When no reader holds or will take anything, waiting frees nothing: the next frame is
    taken even past the cap (the connection goes on; what a peer can send is bounded)."""
    node = MemoryBudget(4 * MiB)
    budget = RecvBudget(4 * MiB, node)
    budget.take(3 * MiB)  # partly received frames, say
    assert budget.try_take(4 * MiB)  # nothing lent anywhere: it fits
    budget.lend(4 * MiB)
    assert not budget.try_take(1) and budget.spent and node.spent


def test_close_by_this_side_drops_the_queue_and_gives_everything_back() -> None:
    async def main() -> None:
        f = Fixture()
        f.inbox.arrived([raw(1000) for _ in range(10)])
        f.pump()
        f.inbox.set_partial(5000)
        f.inbox.close(ConnectionClosed("closed by this side"), drop=True)
        assert f.node.used == 0 and f.node.returnable == 0
        with pytest.raises(ConnectionClosed):
            await f.inbox.get_many(1)

    run(main())


def test_close_by_the_peer_still_hands_out_what_is_queued() -> None:
    async def main() -> None:
        f = Fixture()
        f.inbox.arrived([raw(1000) for _ in range(3)])
        f.pump()
        f.inbox.close(ConnectionClosed("peer closed"))
        assert f.node.used == 3 * raw(1000).cost  # still counted until taken
        assert len(await f.inbox.get_many(10)) == 3
        assert f.node.used == 0
        with pytest.raises(ConnectionClosed):
            await f.inbox.get_many(1)

    run(main())


def test_frames_a_reader_holds_stay_counted_after_the_close_until_dropped() -> None:
    async def main() -> None:
        f = Fixture()
        f.inbox.arrived([bomb()])
        f.pump()
        got = await f.inbox.get_many(1)
        f.inbox.close(ConnectionClosed("closed"), drop=True)
        assert f.node.used == 4 * MiB and f.node.leased == 4 * MiB
        del got
        gc.collect()
        assert f.node.used == 0 and f.node.leased == 0

    run(main())


def test_reclaim_collects_frames_kept_only_by_reference_cycles() -> None:
    async def main() -> None:
        f = Fixture(node=8 * MiB)
        f.inbox.arrived([bomb()])
        f.pump()
        got = await f.inbox.get_many(1)
        cycle: list[object] = [got]
        cycle.append(cycle)
        f.inbox.close(ConnectionClosed("closed"), drop=True)
        del got, cycle
        assert f.node.leased == 4 * MiB
        gc.disable()
        try:
            assert f.node.reclaim(now=0.0) and f.node.leased == 0
            assert not f.node.reclaim(now=0.1)  # at most once per interval
        finally:
            gc.enable()

    run(main())


def test_a_frame_that_does_not_decompress_is_a_fault_at_recv() -> None:
    async def main() -> None:
        f = Fixture()
        good = bomb(1000)
        bad = dataclasses.replace(good, payload=good.payload[:-3] + b"zzz")
        f.inbox.arrived([raw(10), bad])
        f.pump()
        got = await f.inbox.get_many(10)
        assert len(got) == 1 and len(f.faults) == 1
        assert f.faults[0].__traceback__ is None  # it may be kept as a close error's cause

    run(main())


def test_early_frames_are_bounded_in_count_and_bytes() -> None:
    early = EarlyFrames(10, max_bytes=1000)
    early.hold(raw(400))
    early.hold(raw(400))
    with pytest.raises(ProtocolError, match="bytes") as exc_info:
        early.hold(raw(400))
    assert exc_info.value.reason == "buffer_exceeded"
    held = early.release()
    assert len(held) == 2 and isinstance(held[0], PackedFrame) and early.nbytes == 0
    early = EarlyFrames(1)
    early.hold(bomb())
    with pytest.raises(ProtocolError, match="frames") as exc_info:
        early.hold(bomb())
    assert exc_info.value.reason == "buffer_exceeded"


def test_session_logic_judges_packed_frames_without_inflating_messages() -> None:
    logic = SessionLogic("peer")
    frame = bomb()
    assert logic.judge(frame) is frame  # still packed: inflated when recv() takes it
    goaway = FrameDecoder().feed_packed(encode_frame(FrameType.GOAWAY, b"\x08\x00"))[0]
    assert isinstance(logic.judge(goaway), PeerGoaway)


def test_the_decoder_refuses_input_after_discard() -> None:
    dec = FrameDecoder()
    dec.feed_packed(encode_frame(FrameType.MESSAGE, b"x" * 100)[:50])
    assert dec.buffered > 0
    dec.discard()
    assert dec.buffered == 0
    with pytest.raises(ProtocolError):
        dec.feed_packed(b"\x01")
    with pytest.raises(ProtocolError) as exc_info:
        FrameDecoder().feed_packed(b"\x01\x00\x05ab", final=True)
    assert exc_info.value.reason == "truncated_frame"


def test_transport_config_budget_bounds() -> None:
    config = TransportConfig()
    assert config.recv_budget_bytes == 16 * MiB and config.memory_budget_bytes == 256 * MiB
    assert config.memory.limit == 256 * MiB
    # copies share the node's counter; another cap makes another counter
    assert dataclasses.replace(config, idle_timeout=5.0).memory is config.memory
    other = dataclasses.replace(config, memory_budget_bytes=64 * MiB)
    assert other.memory is not config.memory and other.memory.limit == 64 * MiB
    assert dataclasses.replace(config, memory_budget=MemoryBudget(1)) == config  # not compared
    with pytest.raises(ConfigError, match="memory_budget_bytes"):
        TransportConfig(memory_budget_bytes=8 * MiB)
    with pytest.raises(ConfigError, match="recv_budget_bytes"):
        TransportConfig(recv_budget_bytes=1024)
    with pytest.raises(ConfigError):
        TransportConfig(early_frames_bytes=-1)
