"""Errors are mapped once, at the transport boundary: a connection raises only IacErrors (a
network error under it becomes its close error), the node catches no socket OSError, and disk
I/O raises a DiskError naming the path."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest
from conftest import EchoNode, listen_url, ping_frame, run

from iac.errors import ConnectionClosed, DiskError, IacError, TransportError
from iac.protocol.files import FileReceiver, FileSender
from iac.transport import dial, listen
from iac.transport.base import NETWORK_ERRORS, TransportConfig, map_network_errors
from iac.transport.stream import StreamConnection
from iac.wire.identity import Identity
from iac.wire.message import Session

ROOT = Path(__file__).resolve().parent.parent
FAST = TransportConfig(handshake_timeout=5.0, linger_timeout=0.2)

#: What a network failure raises in Python: no handler in the node may name these.
SOCKET_ERRORS = {"OSError", "ConnectionError", "ConnectionResetError", "BrokenPipeError", "SSLError",
                 "socket.error", "ssl.SSLError", "EnvironmentError", "IOError", "NETWORK_ERRORS"}  # fmt: skip


def caught(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, name)`` for each exception class an ``except`` or ``suppress(...)`` names."""
    out = []
    for node in ast.walk(tree):
        names: list[ast.expr] = []
        if isinstance(node, ast.ExceptHandler) and node.type is not None:
            names = list(node.type.elts) if isinstance(node.type, ast.Tuple) else [node.type]
        elif isinstance(node, ast.Call) and ast.unparse(node.func).endswith("suppress"):
            names = list(node.args)
        out += [(node.lineno, ast.unparse(n).lstrip("*")) for n in names]
    return out


def test_the_node_catches_no_socket_error() -> None:
    bad = []
    for path in sorted((ROOT / "iac" / "node").rglob("*.py")):
        for line, name in caught(ast.parse(path.read_text(encoding="utf-8"))):
            if name in SOCKET_ERRORS:
                bad.append(f"{path.relative_to(ROOT)}:{line}: {name}")
    assert not bad, "network errors are the transport's to map:\n" + "\n".join(bad)


def test_the_check_sees_handlers_and_suppress() -> None:
    source = (
        "try:\n    pass\nexcept (IacError, OSError):\n    pass\n"
        "with contextlib.suppress(IacError, ConnectionError):\n    pass\n"
        "with suppress(*NETWORK_ERRORS):\n    pass\n"
    )
    assert [n for _, n in caught(ast.parse(source))] == [
        "IacError",
        "OSError",
        "IacError",
        "ConnectionError",
        "NETWORK_ERRORS",
    ]


def test_map_network_errors_turns_socket_errors_into_transport_errors() -> None:
    with (
        pytest.raises(TransportError, match=r"tls://h:1: ConnectionResetError: reset") as info,
        map_network_errors("tls://h:1"),
    ):
        raise ConnectionResetError("reset")
    assert isinstance(info.value.__cause__, ConnectionResetError)
    with pytest.raises(ValueError), map_network_errors("x"):  # not a network error: unchanged
        raise ValueError("bug")
    with pytest.raises(TimeoutError), map_network_errors("x"):  # the caller's deadline: its own words
        raise TimeoutError
    assert OSError in NETWORK_ERRORS


@pytest.mark.parametrize("transport", ["tls", "unix"])
def test_a_socket_that_fails_on_write_closes_the_connection_with_an_iac_error(
    transport: str, sockdir: Path
) -> None:
    """The kernel refusing a write (here: the transport's write raising, as a socket that was
    reset under it would) closes the connection; send and recv then raise its IacError."""

    async def main() -> None:
        server = Identity.generate()
        listener = await listen(listen_url(transport, sockdir), server, EchoNode(server), config=FAST)
        me = Identity.generate()
        conn = await dial(listener.addresses[0], me, expect=server.agent_id, config=FAST)
        try:
            assert isinstance(conn, StreamConnection)
            transport_ = conn._transport

            def write(data: bytes) -> None:
                raise ConnectionResetError(104, "Connection reset by peer")

            transport_.write = write  # type: ignore[method-assign]
            session = Session()
            await conn.send(ping_frame(me, server.agent_id, session))
            conn.flush()  # the write fails here: no exception leaves the connection
            assert conn.closed
            error = conn.close_error
            assert isinstance(error, ConnectionClosed)
            assert "connection lost: ConnectionResetError" in str(error)
            with pytest.raises(IacError):
                await conn.send(ping_frame(me, server.agent_id, session))
            with pytest.raises(IacError):
                await conn.recv()
            await conn.wait_closed()
        finally:
            await conn.close()
            await listener.close()

    run(main())


def test_a_disk_that_fails_raises_disk_error_with_the_path(tmp_path: Path) -> None:
    src = tmp_path / "a.txt"
    src.write_bytes(b"x" * 100)
    inbox = tmp_path / "inbox"
    receiver = FileReceiver(inbox)
    shutil.rmtree(inbox)  # the inbox directory vanished under the receiver
    sender = FileSender("t-disk", src)
    chunk = sender.next_chunks(0.0)[0]
    with pytest.raises(DiskError) as info:
        receiver.on_chunk(chunk.payload_json, chunk.data, sender="a" * 64)
    assert info.value.path.startswith(str(inbox))
    assert info.value.path in str(info.value)
    assert isinstance(info.value.__cause__, OSError)
    with pytest.raises(DiskError) as info:
        receiver.remove_abandoned(1e12, 1.0)
    assert info.value.path == str(inbox)
