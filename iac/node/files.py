"""File transfer in the node: :meth:`Files.send` drives a sans-IO
:class:`~iac.protocol.files.FileSender` over a connection (window, acks, retransmission, redial and
resume); FILE_TRANSFER messages that arrive are either acks for this node's transfers or chunks and
state queries for its inbox, written by a :class:`~iac.protocol.files.FileReceiver` in a worker
thread, one at a time, in each connection's order.

A transfer's id is derived from the two AgentIds and the file
(:func:`~iac.protocol.files.transfer_id_for`), and every transfer starts by asking the receiver
what it holds: a file whose sender was stopped (a killed process, a closed node) continues where
it stopped the next time it is sent. Partial transfers nobody continues are deleted from the inbox
after ``NodeConfig.file_partial_ttl``."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import os
from collections import OrderedDict, deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from iac.errors import (
    ConfigError,
    ConnectionClosed,
    DiskError,
    ErrorCode,
    FileTransferError,
    LocalError,
    Refusal,
    RemoteError,
    RequestTimeout,
    TransportError,
)
from iac.node.answers import Answers
from iac.node.outbox import Outbox
from iac.node.parts import Parts
from iac.node.peers import Peers
from iac.node.types import FileSent, Item, Key, ReceivedFile
from iac.protocol.files import (
    AckPayload,
    ChunkHeader,
    FileReceiver,
    FileSender,
    TransferProgress,
    default_chunk_size,
    failure_ack,
    hash_file,
    parse_payload,
    transfer_id_for,
)
from iac.transport.base import Connection
from iac.transport.dialer import Backoff
from iac.wire._pb.iac_pb2 import Message
from iac.wire.enums import MessageType
from iac.wire.identity import check_agent_id

log = logging.getLogger("iac.node")

_FILE_TRANSFER = int(MessageType.FILE_TRANSFER)
#: ERROR codes that end a file transfer (others refuse one chunk, which is sent again).
_RETRY_CODES = frozenset({ErrorCode.BUSY.value, ErrorCode.BAD_REQUEST.value, ErrorCode.TIMEOUT.value})
_MAX_FILE_MSGS = 65_536
#: Longest wait between two looks for abandoned partial transfers in the inbox.
_SWEEP_INTERVAL = 60.0


class _Transfer:
    """One outgoing file transfer: its sans-IO sender and what arrived for it (acks, ERRORs)."""

    __slots__ = ("events", "peer", "sender", "waiter")

    def __init__(self, peer: str, sender: FileSender, max_events: int) -> None:
        self.peer = peer
        self.sender = sender
        # Every ack states the receiver's whole state, so dropping the oldest loses nothing.
        self.events: deque[AckPayload | RemoteError] = deque(maxlen=max_events)
        self.waiter: asyncio.Future[None] | None = None

    def push(self, event: AckPayload | RemoteError) -> None:
        self.events.append(event)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)


class Files:
    """Outgoing transfers and the inbox of one node."""

    def __init__(self, parts: Parts, outbox: Outbox, peers: Peers, answers: Answers) -> None:
        self.config = config = parts.config
        self._outbox = outbox
        self._peers = peers
        self._store = parts.store
        self._answers = answers
        self._c = parts.counters
        self._tasks = parts.tasks
        self._clock = config.transport.clock
        self.receiver: FileReceiver | None = None
        self._lock = asyncio.Lock()
        self._job: asyncio.Future[Any] | None = None
        self._outgoing: dict[tuple[str, str], _Transfer] = {}
        self._msgs: OrderedDict[Key, tuple[str, str]] = OrderedDict()
        self._callbacks: list[Callable[[ReceivedFile], Any]] = []
        self._swept_at: float | None = None
        self.closed = False

    def start(self) -> None:
        c = self.config
        if c.inbox_dir is not None:
            self.receiver = FileReceiver(
                c.inbox_dir,
                max_size=c.max_file_size,
                max_frame_size=c.transport.max_frame_size,
                max_transfers=c.max_transfers,
                overwrite=c.overwrite_files,
                durable=c.durable_files,
            )

    async def close(self) -> None:
        self.closed = True
        if self._job is not None:
            await asyncio.wait([self._job])
        if self.receiver is not None:
            self.receiver.close()

    def on_file(self, callback: Callable[[ReceivedFile], Any]) -> Callable[[], None]:
        self._callbacks.append(callback)

        def remove() -> None:
            with contextlib.suppress(ValueError):
                self._callbacks.remove(callback)

        return remove

    def outgoing_keys(self) -> list[tuple[str, str]]:
        """The transfers this node sends now, as (peer, transfer id)."""
        return list(self._outgoing)

    def expire(self) -> None:
        """Close idle incoming transfers' files; now and then delete abandoned ones (at the first
        call, then every ``min(file_partial_ttl / 4, 60)`` seconds)."""
        rx = self.receiver
        if rx is None or (self._job is not None and not self._job.done()):
            return
        c, mono = self.config, self._clock.monotonic()
        rx.expire(mono, c.file_idle_timeout)
        if self._swept_at is None or mono - self._swept_at >= min(c.file_partial_ttl / 4, _SWEEP_INTERVAL):
            self._swept_at = mono
            try:
                removed = rx.remove_abandoned(self._clock.now_us() / 1e6, c.file_partial_ttl)
            except DiskError as exc:
                log.warning("inbox %s: cannot look for abandoned transfers: %s", rx.inbox, exc)
                return
            if removed:
                log.info("inbox %s: deleted %d abandoned partial transfer(s)", rx.inbox, removed)

    def stats(self) -> tuple[dict[str, int], dict[str, int]]:
        """(``NodeStats.files``, ``NodeStats.file_refused``)."""
        c, rx = self._c, self.receiver
        files = {
            "sent": c.files_sent,
            "received": c.files_received,
            "failed": c.files_failed,
            "resumed": c.files_resumed,
            "chunks_received": rx.stats.chunks if rx is not None else 0,
            "chunk_duplicates": rx.stats.duplicates if rx is not None else 0,
        }
        return files, dict(rx.stats.refused) if rx is not None else {}

    # --- sending ----------------------------------------------------------------------------------

    async def send(
        self,
        peer: str,
        path: str | os.PathLike[str],
        *,
        name: str | None,
        on_progress: Callable[[TransferProgress], None] | None,
        timeout: float | None,
        via: str | None,
        window: int | None,
        chunk_size: int | None,
    ) -> FileSent:
        check_agent_id(peer)
        c = self.config
        stall = c.request_timeout if timeout is None else timeout
        if not stall > 0:
            raise ConfigError("timeout must be positive")
        loop = asyncio.get_running_loop()
        started = loop.time()
        conn = await self._peers.first_hop(peer, via, self._clock.now_us())
        _, limit = self._outbox.frame_params(conn)
        size_used = chunk_size if chunk_size is not None else c.file_chunk_size
        if size_used is None:
            size_used = default_chunk_size(limit)

        def prepare() -> FileSender:  # hashes the file: in a worker thread
            size, digest = hash_file(path)
            label = name if name is not None else Path(path).name
            tid = transfer_id_for(self._outbox.agent_id, peer, label, size, size_used, digest)
            return FileSender(
                tid,
                path,
                name=name,
                chunk_size=size_used,
                max_frame_size=limit,
                window=window if window is not None else c.file_window,
                retransmit_timeout=c.file_retransmit_timeout,
                on_progress=on_progress,
                sha256=digest,
            )

        sender = await asyncio.to_thread(prepare)
        fkey = (peer, sender.transfer_id)
        if fkey in self._outgoing:
            sender.close()
            raise LocalError(f"already sending {sender.name!r} to {peer[:16]}…")
        st = _Transfer(peer, sender, max_events=4 * sender.window + 16)
        self._outgoing[fkey] = st
        try:
            resumed = await self._drive(st, conn, via, stall)
        except BaseException:
            self._c.files_failed += 1
            raise
        finally:
            self._outgoing.pop(fkey, None)
            for k in [k for k, v in self._msgs.items() if v == fkey]:
                del self._msgs[k]
            sender.close()
        self._c.files_sent += 1
        return FileSent(
            peer=peer,
            transfer_id=sender.transfer_id,
            name=sender.name,
            size=sender.size,
            sha256=sender.sha256,
            chunks=sender.total,
            chunks_sent=sender.stats.chunks_sent,
            chunks_resent=sender.stats.chunks_resent,
            resumed=resumed,
            seconds=loop.time() - started,
            chunks_resumed=sender.total - (sender.stats.chunks_sent - sender.stats.chunks_resent),
        )

    async def _drive(self, st: _Transfer, conn: Connection, via: str | None, stall: float) -> int:
        """The send loop of one transfer: window, acks, timeouts, reconnect and resume.

        It starts with a start query: the receiver may hold part of the file from an earlier
        sender of the same transfer (another process), and then only the rest is sent."""
        loop = asyncio.get_running_loop()
        sender, peer = st.sender, st.peer
        fkey = (peer, sender.transfer_id)
        resumed = 0
        # Ask the receiver what it holds before sending: at the start, and after each reconnect.
        need_query, starting = True, True
        queried_at: float | None = None
        last_progress = loop.time()
        done_before = sender.progress.chunks_done
        closed: asyncio.Future[None] = asyncio.ensure_future(conn.wait_closed())
        try:
            while not sender.done:
                if self.closed:
                    raise ConnectionClosed("the node is closed")
                if closed.done():
                    sender.connection_lost()
                    st.events.clear()
                    conn = await self._redial(peer, via, last_progress + stall)
                    closed = asyncio.ensure_future(conn.wait_closed())
                    resumed += 1
                    self._c.files_resumed += 1
                    need_query, queried_at = True, None
                now = loop.time()
                try:
                    if need_query:
                        if queried_at is None or now - queried_at >= sender.retransmit_timeout:
                            query = self._outbox.build(
                                peer,
                                _FILE_TRANSFER,
                                None,
                                kind="file",
                                payload_json=sender.query_json(start=starting),
                            )
                            self._note(query, fkey)
                            queried_at = now
                            await self._outbox.send_on(conn, query)
                    else:
                        for chunk in sender.next_chunks(now):
                            msg = self._outbox.build(
                                peer,
                                _FILE_TRANSFER,
                                None,
                                kind="file",
                                payload_json=chunk.payload_json,
                                extra_data=chunk.data,
                            )
                            self._note(msg, fkey)
                            await self._outbox.send_on(conn, msg, compress=False)
                except TransportError as exc:
                    log.debug("file transfer to %s…: send failed (%s)", peer[:16], exc)
                    await asyncio.wait([closed], timeout=self.config.transport.handshake_timeout)
                    if not closed.done():
                        raise
                    continue
                # Wait for an ack or ERROR, a retransmission timer, the connection closing, or a stall.
                timer = sender.next_timer() if not need_query else None
                if need_query and queried_at is not None:
                    timer = queried_at + sender.retransmit_timeout
                wake_at = last_progress + stall if timer is None else min(timer, last_progress + stall)
                if not st.events:
                    st.waiter = loop.create_future()
                    await asyncio.wait(
                        [st.waiter, closed],
                        timeout=max(0.0, wake_at - loop.time()),
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                    st.waiter = None
                while st.events:
                    ev = st.events.popleft()
                    if isinstance(ev, RemoteError):
                        if ev.code in _RETRY_CODES:
                            log.debug("file transfer to %s…: refused once (%s)", peer[:16], ev)
                            continue
                        raise ev
                    if need_query:  # the receiver's state: continue from exactly what it holds
                        sender.resume_from(ev)  # a failed ack raises TransferRefused
                        need_query, starting, queried_at = False, False, None
                        last_progress = loop.time()
                    else:
                        sender.on_ack(ev, now=loop.time())
                now = loop.time()
                if sender.progress.chunks_done != done_before:
                    done_before = sender.progress.chunks_done
                    last_progress = now
                if not need_query:
                    timer = sender.next_timer()
                    if timer is not None and timer <= now:
                        sender.on_timeout(now)
                if now >= last_progress + stall and not sender.done:
                    raise RequestTimeout(f"file transfer to {peer[:16]}…: no progress for {stall:g} s")
        finally:
            closed.cancel()
        return resumed

    async def _redial(self, peer: str, via: str | None, deadline: float) -> Connection:
        """Reach ``peer`` (or the relay) again after a broken connection, retrying until ``deadline``."""
        loop = asyncio.get_running_loop()
        backoff = Backoff(initial=0.05, maximum=1.0, jitter=0.0)
        while True:
            try:
                return await self._peers.first_hop(peer, via, self._clock.now_us())
            except TransportError as exc:
                delay = backoff.next_delay()
                if self.closed or loop.time() + delay >= deadline:
                    raise
                log.debug("file transfer to %s…: redial failed (%s)", peer[:16], exc)
            await asyncio.sleep(delay)  # back off between dial attempts

    def _note(self, msg: Message, fkey: tuple[str, str]) -> None:
        """Remember which transfer a chunk message belongs to (an ERROR answering it ends up there)."""
        self._msgs[(msg.to, msg.session_id, msg.msg_id)] = fkey
        while len(self._msgs) > _MAX_FILE_MSGS:
            self._msgs.popitem(last=False)

    def on_error(self, key: Key, error: RemoteError) -> bool:
        """An ERROR that answers one of this node's chunk messages; False if it answers none."""
        fkey = self._msgs.get(key)
        st = self._outgoing.get(fkey) if fkey is not None else None
        if st is None:
            return False
        st.push(error)
        return True

    # --- receiving --------------------------------------------------------------------------------

    async def on_message(self, item: Item) -> None:
        """A FILE_TRANSFER message that passed the pipeline: an ack for one of this node's
        transfers, or a chunk / state query for the inbox."""
        msg, origin = item.msg, item.key[0]
        commit = functools.partial(self._store.commit_item, item)
        try:
            parsed = parse_payload(msg.payload_json)
        except FileTransferError as exc:
            commit(self._clock.now_us())
            await self._answers.refuse(item.conn, msg, Refusal.FILE_TRANSFER, f"{exc.reason}: {exc}")
            return
        if isinstance(parsed, AckPayload):
            commit(self._clock.now_us())
            st = self._outgoing.get((origin, parsed.transfer_id))
            if st is None:
                self._c.refused[Refusal.UNMATCHED_RESPONSE.value] += 1
            else:
                st.push(parsed)
            return
        rx = self.receiver
        if rx is None:
            commit(self._clock.now_us())
            await self._answers.refuse(
                item.conn, msg, Refusal.NO_HANDLER, "this node takes no files (no inbox)"
            )
            return
        completed = rx.stats.completed
        try:
            async with self._lock:
                job = asyncio.get_running_loop().run_in_executor(
                    None,
                    functools.partial(
                        rx.on_message,
                        msg.payload_json,
                        msg.extra_data,
                        sender=origin,
                        now=self._clock.monotonic(),
                    ),
                )
                self._job = job
                ack = await asyncio.shield(job)
        except FileTransferError as exc:
            commit(self._clock.now_us())
            self._c.refused[Refusal.FILE_TRANSFER.value] += 1
            if not exc.fatal:  # only this chunk: the sender sends it again after its timeout
                code = exc.row.error or ErrorCode.BAD_REQUEST  # busy for too_many_transfers
                await self._answers.send_error(item.conn, origin, msg, code, f"{exc.reason}: {exc}")
                return
            ack = failure_ack(exc, parsed.transfer_id)
        except DiskError as exc:
            commit(self._clock.now_us())
            log.warning("file transfer from %s…: %s", origin[:16], exc)
            await self._answers.send_error(
                item.conn, origin, msg, ErrorCode.INTERNAL, "the receiver cannot write"
            )
            return
        commit(self._clock.now_us())
        answer = self._outbox.build(origin, _FILE_TRANSFER, None, kind="file", payload_json=ack.to_json())
        await self._outbox.try_send_to(origin, answer, item.conn)
        if isinstance(parsed, ChunkHeader) and rx.stats.completed > completed:
            self._c.files_received += 1
            got = ReceivedFile(
                origin, parsed.transfer_id, parsed.name, rx.inbox / parsed.name, parsed.size, parsed.sha256
            )
            for cb in self._callbacks:
                try:
                    res = cb(got)
                    if inspect.isawaitable(res):
                        self._tasks.spawn_logged(res, "file callback")
                except Exception:
                    log.exception("file callback failed")


__all__ = ["Files"]
