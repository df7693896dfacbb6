"""A QUIC dial leaves no future behind: after dials that fail (nothing listening, no answer
within the handshake timeout, cancelled mid-handshake) or succeed, and once every QUIC
connection they made is gone, ``gc.collect()`` on the running loop reports nothing to its
exception handler (no "Future exception was never retrieved")."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import weakref
from typing import Any

from conftest import run
from ports import free_udp_port

import iac.transport.quic.dial as dial
from iac.errors import TransportError
from iac.testing import eventually
from iac.transport.base import TransportConfig
from iac.transport.quic import dial_quic, listen_quic
from iac.wire.identity import Identity

FAST = TransportConfig(handshake_timeout=0.3, linger_timeout=0.1)


class Silent(asyncio.DatagramProtocol):
    """A UDP socket that reads every datagram and never answers; ``new_source`` is set when
    a datagram comes from a source address not seen before (a new dial's first Initial)."""

    def __init__(self) -> None:
        self.sources: set[Any] = set()
        self.new_source = asyncio.Event()

    def datagram_received(self, data: bytes, addr: Any) -> None:
        if addr not in self.sources:
            self.sources.add(addr)
            self.new_source.set()


def describe(made: Any) -> str:
    out = []
    for ref in made:
        obj = ref()
        if obj is None:
            continue
        out.append(repr([type(r).__name__ + ":" + repr(r)[:150] for r in gc.get_referrers(obj)]))
        break
    return "\n".join(out)


def test_failed_cancelled_and_successful_dials_leave_no_future() -> None:
    seen: list[dict[str, Any]] = []
    made: list[weakref.ref[Any]] = []
    real_class = dial.protocol_class

    def recording_class(lib: Any) -> Any:
        cls = real_class(lib)

        def make(quic: Any) -> Any:
            proto = cls(quic)
            made.append(weakref.ref(proto))
            return proto

        return make

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, ctx: seen.append(ctx))
        identity = Identity.generate()
        silent_transport, silent = await loop.create_datagram_endpoint(Silent, local_addr=("127.0.0.1", 0))
        silent_url = f"quic://127.0.0.1:{silent_transport.get_extra_info('sockname')[1]}"
        server = await listen_quic("quic://127.0.0.1:0", Identity.generate(), lambda conn: conn.wait_closed())
        failures = 0
        try:
            for _ in range(7):  # nothing listening: an ICMP unreachable or the timeout
                with contextlib.suppress(TransportError):
                    await dial_quic(f"quic://127.0.0.1:{free_udp_port()}", identity, config=FAST)
                    raise AssertionError("dial to a closed port succeeded")
                failures += 1
            for _ in range(7):  # a peer that never answers: the handshake timeout
                try:
                    await dial_quic(silent_url, identity, config=FAST)
                except TransportError as exc:
                    assert "timed out" in str(exc)
                    failures += 1
            for _ in range(6):  # cancelled once its first datagram arrived
                silent.new_source.clear()
                task = loop.create_task(dial_quic(silent_url, identity, config=TransportConfig()))
                await silent.new_source.wait()
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                assert task.cancelled()
                failures += 1
            conn = await dial_quic(server.addresses[0], identity, config=FAST)
            await conn.close()
            del conn, task
        finally:
            await server.close()
            silent_transport.close()
        assert failures == 20
        assert len(made) == 21, [len(made)]

        def all_gone() -> bool:
            gc.collect()  # while the loop runs: a leaked future reports to its handler here
            return all(ref() is None for ref in made)

        await eventually(all_gone, timeout=10.0, interval=0.05, message=lambda: describe(made))
        gc.collect()

    dial.protocol_class = recording_class  # type: ignore[assignment]
    try:
        run(main(), loop_errors=False)
    finally:
        dial.protocol_class = real_class  # type: ignore[assignment]
    assert seen == [], [f"{c.get('message')}: {c.get('exception')!r}" for c in seen]
