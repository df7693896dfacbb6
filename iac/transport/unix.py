"""UNIX stream sockets: same frames as TLS/TCP, no certificate.

The server sends its HELLO first; the client's HELLO echoes the server's nonce
(freshness instead of a channel binding) and names the server in
``peer_agent_id``. Before any HELLO, the server checks the connecting process's
uid (``SO_PEERCRED``, Linux) against ``config.allowed_uids`` (default: only its
own uid) and refuses others with GOAWAY ADMISSION_DENIED. The handshake limit
counts new connections per peer uid (local peers are exempt unless
``handshake_limit_local``).

The socket file lives in a private directory (created with mode 0700 when
missing; an existing one must belong to this user and give group and others no
access) and has mode 0600. A stale socket file left by a dead node is replaced;
one with a live listener is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import stat
import struct
from pathlib import Path

from iac.errors import ConfigError, HandshakeError, ProtocolError, TransportError
from iac.protocol.handshake import HelloOrder, ServerHandshake
from iac.transport.base import (
    Address,
    Connection,
    Listener,
    OnConnection,
    TransportConfig,
)
from iac.transport.session import client_handshake, server_handshake
from iac.transport.stream.connection import connect_errors, establish
from iac.transport.stream.listener import StreamListener, accept_backlog
from iac.transport.stream.protocol import FrameProtocol
from iac.wire.identity import Identity


def peer_uid(sock: socket.socket | None) -> int | None:
    """The uid of the process on the other end (Linux SO_PEERCRED), or None if unknown."""
    if sock is None or not hasattr(socket, "SO_PEERCRED"):
        return None
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


def _prepare_dir(path: Path) -> None:
    parent = path.parent
    if not parent.exists():
        try:
            parent.mkdir(mode=0o700, parents=True)
        except OSError as exc:
            raise ConfigError(f"{parent}: cannot create socket directory: {exc.strerror}") from None
    st = parent.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise ConfigError(
            f"{parent}: the socket directory must be private (owned by you, mode 0700; "
            f"it is mode {stat.S_IMODE(st.st_mode):04o})"
        )


def _remove_stale(path: Path) -> None:
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise ConfigError(f"{path}: exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return
    finally:
        probe.close()
    raise ConfigError(f"{path}: another node is listening on this socket")


async def dial_unix(
    address: Address,
    identity: Identity,
    *,
    expect: str | None = None,
    config: TransportConfig,
    session_id: int = 0,
) -> Connection:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + config.handshake_timeout
    url = address.url
    with connect_errors(url, config, refused="connection refused (no node listening)"):
        try:
            async with asyncio.timeout_at(deadline):
                _transport, proto = await loop.create_unix_connection(
                    lambda: FrameProtocol(config), address.path
                )
        except FileNotFoundError:
            raise TransportError(f"{url}: no socket at {address.path}") from None
    hs = client_handshake(
        identity, config, order=HelloOrder.SERVER_FIRST, binding=b"", expect=expect, session_id=session_id
    )
    return await establish(proto, hs, config=config, transport="unix", address=url, deadline=deadline)


async def listen_unix(
    address: Address,
    identity: Identity,
    on_connection: OnConnection,
    *,
    config: TransportConfig,
) -> Listener:
    path = Path(address.path)
    _prepare_dir(path)
    _remove_stale(path)
    allowed = config.allowed_uids if config.allowed_uids is not None else frozenset({os.getuid()})

    def make_handshake() -> ServerHandshake:
        return server_handshake(identity, config, order=HelloOrder.SERVER_FIRST, binding=b"")

    def source(transport: asyncio.BaseTransport) -> str:
        return f"uid:{peer_uid(transport.get_extra_info('socket'))}"

    def precheck(transport: asyncio.BaseTransport) -> ProtocolError | None:
        uid = peer_uid(transport.get_extra_info("socket"))
        if uid is None or uid not in allowed:
            return HandshakeError(f"uid {uid} is not allowed on this socket", reason="admission_denied")
        return None

    listener = _UnixListener(
        path,
        config=config,
        transport="unix",
        on_connection=on_connection,
        make_handshake=make_handshake,
        describe_peer=lambda _w: address.url,
        precheck=precheck,
        source=source,
    )
    try:
        server = await asyncio.get_running_loop().create_unix_server(
            listener.protocol_factory(), path=str(path), backlog=accept_backlog(config)
        )
    except OSError as exc:
        raise TransportError(f"{address.url}: cannot listen: {exc.strerror or exc}") from None
    os.chmod(path, 0o600)
    listener.attach(server, [address.url])
    return listener


class _UnixListener(StreamListener):
    def __init__(self, path: Path, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.path = path

    async def close(self) -> None:
        await super().close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


__all__ = ["dial_unix", "listen_unix", "peer_uid"]
