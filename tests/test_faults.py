"""Faults on the receiving side: a replay store that fails, and an answer too large to send.

Each is counted and survivable: the connection goes on, nothing is lost in silence."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Sequence

import pytest
from conftest import run

from iac import Node, NodeConfig, RemoteError
from iac.errors import StoreUnavailable
from iac.protocol.replay import ReplayConfig, Verdict
from iac.stores.memory import MemoryReplayStore
from iac.testing import eventually
from iac.transport import TransportConfig
from iac.wire import MessageType


class FlakyStore:
    """A replay store that fails (StoreUnavailable) while ``down``; ``blocking`` decides whether the
    node calls it on a worker thread (like SQLite and Redis) or on the loop (like memory)."""

    def __init__(self, now_us: int, *, blocking: bool) -> None:
        self._inner = MemoryReplayStore(now_us, ReplayConfig())
        self.blocking = blocking
        self.down = False
        self.calls = 0

    @property
    def max_skew_us(self) -> int:
        return self._inner.max_skew_us

    @property
    def history_start_us(self) -> int | None:
        return self._inner.history_start_us

    def _check(self) -> None:
        self.calls += 1
        if self.down:
            raise StoreUnavailable("the store is down")

    def check_and_mark(self, sender: str, session_id: int, msg_id: int, now_us: int) -> Verdict:
        self._check()
        return self._inner.check_and_mark(sender, session_id, msg_id, now_us)

    def reserve(self, sender: str, session_id: int, msg_id: int, now_us: int) -> Verdict:
        self._check()
        return self._inner.reserve(sender, session_id, msg_id, now_us)

    def commit(self, sender: str, session_id: int, msg_id: int, now_us: int) -> None:
        self._check()
        self._inner.commit(sender, session_id, msg_id, now_us)

    def release(self, sender: str, session_id: int, msg_id: int, now_us: int) -> None:
        self._check()
        self._inner.release(sender, session_id, msg_id, now_us)

    def expire(self, now_us: int) -> int:
        return self._inner.expire(now_us)

    @property
    def reservation_lease_us(self) -> int | None:
        return self._inner.reservation_lease_us

    def renew(self, keys: Sequence[tuple[str, int, int]], now_us: int) -> int:
        self._check()
        return self._inner.renew(keys, now_us)

    def frontier(
        self, sender: str, session_id: int, now_us: int, exclude: Collection[int] = ()
    ) -> int | None:
        self._check()
        return self._inner.frontier(sender, session_id, now_us, exclude)


@pytest.mark.parametrize("blocking", [True, False], ids=["worker-thread", "on-loop"])
def test_a_failing_replay_store_is_counted_and_survived(blocking: bool) -> None:
    async def main() -> None:
        fast = NodeConfig(retransmit_initial=0.05, retransmit_max=0.2)
        store = FlakyStore(fast.transport.clock.now_us(), blocking=blocking)
        async with (
            Node(listen="tls://127.0.0.1:0", replay_store=store, config=fast) as bob,
            Node(config=fast) as alice,
        ):
            got: list[int] = []
            bob.on("RUN")(lambda ctx: got.append(ctx.payload["i"]) or "ok")
            alice.add_peer(bob.agent_id, *bob.addresses)
            assert (await alice.request(bob.agent_id, "RUN", {"i": 0}, timeout=5)).payload == "ok"
            conn = alice.connection(bob.agent_id)

            store.down = True
            # A plain request: a retryable ERROR at once, not a silent timeout.
            with pytest.raises(RemoteError) as err:
                await alice.request(bob.agent_id, "RUN", {"i": 1}, timeout=30)
            assert err.value.code == "busy" and "store" in err.value.message
            # An ACK_REQUESTED message: not acknowledged while the store is down; its sender retransmits.
            sent = await alice.send(bob.agent_id, "RUN", {"i": 2}, ack=True)
            calls = store.calls
            await eventually(lambda: store.calls >= calls + 2)  # at least one retransmission reached it
            assert not sent.acked and got == [0]
            refused = bob.stats().refused.get("store_unavailable", 0)
            assert refused >= 2

            store.down = False  # service resumes by itself: no restart, same connection
            await asyncio.wait_for(sent.wait(), 10)
            assert (await alice.request(bob.agent_id, "RUN", {"i": 3}, timeout=5)).payload == "ok"
            assert got == [0, 2, 3]  # each handled once; the refused request never reached the handler
            assert alice.connection(bob.agent_id) is conn and not conn.closed

    run(main())


def test_a_reply_too_large_for_the_caller_is_an_error_at_once(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        small = NodeConfig(transport=TransportConfig(max_frame_size=64 * 1024, recv_budget_bytes=1 << 20))
        async with Node(listen="tls://127.0.0.1:0") as bob, Node(config=small) as alice:
            bob.on(MessageType.RUN)(lambda ctx: "x" * 100_000)  # over what Alice announced
            bob.on(MessageType.CREATE)(lambda ctx: "fine")
            alice.add_peer(bob.agent_id, *bob.addresses)
            with caplog.at_level(logging.WARNING, logger="iac.node"), pytest.raises(RemoteError) as err:
                await alice.request(bob.agent_id, MessageType.RUN, timeout=30)
            assert err.value.code == "internal" and "too large" in err.value.message
            stats = bob.stats()
            assert stats.answers_too_large == 1 and stats.replies_sent == 0
            assert stats.errors_sent == {"internal": 1}
            assert any("too large to send" in r.getMessage() for r in caplog.records)
            # the connection goes on
            assert (await alice.request(bob.agent_id, MessageType.CREATE, timeout=5)).payload == "fine"

    run(main())
