"""A wiretap for UNIX-socket connections: what really crossed the wire.

:class:`UnixTap` listens on a socket of its own and connects each client that
dials it to the target listener, copying the bytes both ways unchanged (UNIX
sockets carry IAC frames without TLS, and their HELLO binds no channel, so a
transparent copy is a valid path). It also decodes what it copies, following
the dictionaries the two sides push each other, and keeps every frame, so that
a test can assert what a peer (or a relay) actually received: a sealed payload
that never appears in clear, the exact payloads a node writes, the FORWARD
envelope around a relayed message.

Example::

    async with UnixTap(server.addresses[0]) as tap:  # a unix:// address
        client.add_peer(server.agent_id, tap.url)
        await client.request(server.agent_id, MessageType.PING, timeout=5)
        assert [m.msg_type for m in tap.messages(UP)] == [MessageType.PING]

The tap never changes, delays or drops a byte: a frame it cannot decode is
recorded in :attr:`UnixTap.errors` and that direction is copied without being
decoded from then on.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from types import TracebackType

from google.protobuf.message import DecodeError

from iac.errors import ConfigError, IacError
from iac.transport.base import parse_address
from iac.wire._pb.iac_pb2 import Dict, Forward, Hello, Message
from iac.wire.dicts import Dictionary, DictionarySet, default_dictionary
from iac.wire.elide import elides, forwards_elided, pair_prefix, restore, restore_forward
from iac.wire.frames import DEFAULT_MAX_FRAME_SIZE, Frame, FrameDecoder, FrameType

#: From the side that dialed the tap to the target listener.
UP = "up"
#: From the target listener back to the side that dialed the tap.
DOWN = "down"


@dataclass(frozen=True)
class TappedFrame:
    """One frame that crossed the tap: on which connection (0, 1, … in the order
    they were accepted), which way, and the frame (its body decompressed)."""

    connection: int
    direction: str
    frame: Frame
    #: The elided ``from``/``to`` prefix :meth:`message` puts back (both HELLOs announced
    #: ``elide/1``); ``frame`` stays as it crossed.
    prefix: bytes = b""
    #: The (sender, receiver) AgentIds a compact FORWARD is restored with (both HELLOs announced
    #: ``elide-forward/1``); None: taken as it is.
    ends: tuple[str, str] | None = None

    @property
    def type(self) -> FrameType:
        return self.frame.type

    def message(self) -> Message:
        """A MESSAGE frame's message, parsed (its signature is not checked)."""
        if self.frame.type != FrameType.MESSAGE:
            raise ConfigError(f"a {self.frame.type.name} frame carries no message")
        return Message.FromString(restore(self.frame.body, self.prefix) if self.prefix else self.frame.body)

    def forward(self) -> Forward:
        """A FORWARD frame's envelope, parsed (``forward().message`` is the signed inner message)."""
        if self.frame.type != FrameType.FORWARD:
            raise ConfigError(f"a {self.frame.type.name} frame is not a FORWARD")
        body = self.frame.body
        return Forward.FromString(restore_forward(body, *self.ends) if self.ends else body)


class _Direction:
    """One direction of one connection: its decoder and the dictionaries it knows."""

    def __init__(
        self,
        connection: int,
        name: str,
        dictionaries: DictionarySet,
        max_frame_size: int,
        hellos: dict[str, Hello],
    ) -> None:
        self.connection = connection
        self.name = name
        self.hellos = hellos  # both directions' HELLOs, shared by the connection's two directions
        self.dictionaries = DictionarySet(dictionaries)  # pushes stay on this connection
        self.decoder: FrameDecoder | None = FrameDecoder(
            dictionaries=self.dictionaries, max_frame_size=max_frame_size
        )


class UnixTap:
    """A transparent, recording relay in front of a ``unix://`` listener.

    ``dictionaries``: what the tap decodes with at first (default: the shipped
    dictionary, which nodes announce by default); dictionaries pushed in DICT
    frames are added per connection and direction as they pass.
    """

    def __init__(
        self,
        target: str,
        *,
        dictionaries: DictionarySet | None = None,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
    ) -> None:
        addr = parse_address(target)
        if addr.scheme != "unix":
            raise ConfigError(f"{target!r}: the tap sits in front of a unix:// listener")
        self.target = addr.path
        self.dictionaries = (
            dictionaries if dictionaries is not None else DictionarySet([default_dictionary()])
        )
        self.max_frame_size = max_frame_size
        #: Every frame decoded, in the order the tap copied it.
        self.frames: list[TappedFrame] = []
        #: Decoding failures (the bytes were still copied).
        self.errors: list[IacError] = []
        #: Connections accepted so far.
        self.connections = 0
        self.url = ""
        self._dir: str | None = None
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        """Listen; return the ``unix://`` URL to dial instead of the target."""
        self._dir = tempfile.mkdtemp(prefix="iac-tap-")
        path = os.path.join(self._dir, "tap.sock")
        self._server = await asyncio.start_unix_server(self._accept, path)
        self.url = f"unix://{path}"
        return self.url

    async def close(self) -> None:
        """Stop listening and cut every connection through the tap."""
        if self._server is not None:
            self._server.close()
        for w in self._writers:
            w.transport.abort()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    async def __aenter__(self) -> UnixTap:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # --- what crossed ---------------------------------------------------------------------------

    def tapped(self, direction: str | None = None, ftype: FrameType | None = None) -> list[TappedFrame]:
        """The frames that crossed (one ``direction``, :data:`UP` or :data:`DOWN`; one type)."""
        return [
            t
            for t in self.frames
            if (direction is None or t.direction == direction) and (ftype is None or t.type == ftype)
        ]

    def messages(self, direction: str | None = None) -> list[Message]:
        """The messages of the MESSAGE frames that crossed, in order."""
        return [t.message() for t in self.tapped(direction, FrameType.MESSAGE)]

    def forwards(self, direction: str | None = None) -> list[Forward]:
        """The envelopes of the FORWARD frames that crossed, in order."""
        return [t.forward() for t in self.tapped(direction, FrameType.FORWARD)]

    # --- the copy ---------------------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        index = self.connections
        self.connections += 1
        self._writers.append(writer)
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(self.target)
            self._writers.append(up_writer)
            hellos: dict[str, Hello] = {}
            up, down = (
                _Direction(index, name, self.dictionaries, self.max_frame_size, hellos) for name in (UP, DOWN)
            )
            await asyncio.gather(self._pipe(reader, up_writer, up), self._pipe(up_reader, writer, down))
            up_writer.close()
        except OSError:
            pass  # the target is gone: the client sees its connection end
        except asyncio.CancelledError:
            pass  # close() cut the connection (this task is the stream server's; it ends quietly)
        finally:
            writer.close()
            if task is not None:
                self._tasks.discard(task)

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, d: _Direction) -> None:
        with contextlib.suppress(OSError):
            while data := await src.read(65536):
                dst.write(data)  # copied first: decoding never holds a byte back
                self._observe(d, data)
                await dst.drain()
            if dst.can_write_eof():
                dst.write_eof()  # a half-close passes through; the other direction goes on

    def _observe(self, d: _Direction, data: bytes) -> None:
        if d.decoder is None:
            return
        try:
            frames = d.decoder.feed(data)
        except IacError as exc:
            self.errors.append(exc)
            d.decoder = None
            return
        for frame in frames:
            prefix = self._prefix(d) if frame.type == FrameType.MESSAGE else b""
            ends = self._ends(d) if frame.type == FrameType.FORWARD else None
            self.frames.append(TappedFrame(d.connection, d.name, frame, prefix, ends))
            if frame.type == FrameType.DICT:
                self._install(d, frame.body)
            elif frame.type == FrameType.HELLO:
                with contextlib.suppress(DecodeError):
                    d.hellos[d.name] = Hello.FromString(frame.body)

    @staticmethod
    def _prefix(d: _Direction) -> bytes:
        """What a MESSAGE in direction ``d`` left out, if both HELLOs announced ``elide/1``."""
        mine, theirs = d.hellos.get(d.name), d.hellos.get(DOWN if d.name == UP else UP)
        if mine is None or theirs is None or not elides(mine.capabilities, theirs.capabilities):
            return b""
        return pair_prefix(mine.agent_id, theirs.agent_id)

    @staticmethod
    def _ends(d: _Direction) -> tuple[str, str] | None:
        """Who sends and who receives in direction ``d``, if both HELLOs announced
        ``elide-forward/1`` (a FORWARD may then be compact)."""
        mine, theirs = d.hellos.get(d.name), d.hellos.get(DOWN if d.name == UP else UP)
        if mine is None or theirs is None or not forwards_elided(mine.capabilities, theirs.capabilities):
            return None
        return mine.agent_id, theirs.agent_id

    def _install(self, d: _Direction, body: bytes) -> None:
        """A pushed dictionary: the pushing side compresses with it once acknowledged."""
        try:
            d.dictionaries.add(Dictionary(Dict.FromString(body).content))
        except Exception as exc:  # a push the peer refuses too; note it and go on
            self.errors.append(exc if isinstance(exc, IacError) else ConfigError(f"pushed dictionary: {exc}"))


__all__ = ["DOWN", "UP", "TappedFrame", "UnixTap"]
