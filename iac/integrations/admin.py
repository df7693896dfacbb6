"""A node's status on a private UNIX socket, for ``iac status`` (never on a network port).

::

    admin = AdminSocket()                      # default path: see default_path()
    async with Node(listen=[...], metrics=admin) as node:   # or admin.attach(node) after start
        ...                                    # `iac status` (or fetch_status(admin.path)) reads it

The socket is mode 0600 in a directory of this user with mode 0700 (created so when missing; an
existing one that group or others can enter is refused). A client whose uid (``SO_PEERCRED``,
Linux) is not this process's is closed unanswered and logged. The protocol: the client sends one
line, ``status``; the node answers one JSON object (:func:`status_of`) and closes. Requests are
bounded (:data:`MAX_REQUEST` bytes within :data:`READ_TIMEOUT` seconds, :data:`MAX_CLIENTS` at once).
When every slot is taken, a new client takes the slot of the client that has waited longest without
sending anything: idle clients of this uid delay ``iac status`` by milliseconds, never make it fail.

The default path is ``$XDG_RUNTIME_DIR/iac/ID.sock`` (``ID``: the first 16 hex digits of the
node's AgentId) when ``XDG_RUNTIME_DIR`` names a directory, else ``~/.iac/run/ID.sock``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import socket
import stat
import sys
import termios
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from iac.errors import ConfigError, TransportError
from iac.node.node import Node
from iac.transport.unix import peer_uid

log = logging.getLogger("iac.integrations")

#: The largest request line, in bytes.
MAX_REQUEST = 1024
#: Seconds a client has to send its request line.
READ_TIMEOUT = 1.0
#: Clients served at once; more are closed unanswered.
MAX_CLIENTS = 8
#: The largest answer a client reads, in bytes.
MAX_ANSWER = 64 * 1024 * 1024
#: Connections :func:`fetch_status` tries when one is closed unanswered.
ATTEMPTS = 3
#: The request that asks for the status.
STATUS = b"status"
#: Version of the JSON answer.
FORMAT = 1


def runtime_dir() -> Path:
    """Where status sockets live: ``$XDG_RUNTIME_DIR/iac``, else ``~/.iac/run``."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and Path(xdg).is_dir():
        return Path(xdg) / "iac"
    return Path.home() / ".iac" / "run"


def default_path(agent_id: str) -> Path:
    """The status socket of the node ``agent_id`` when none is named: ``runtime_dir()/ID.sock``."""
    return runtime_dir() / f"{agent_id[:16]}.sock"


def private_dir(directory: Path) -> None:
    """Make ``directory`` (mode 0700) when missing; refuse one that is not this user's or that group
    or others can enter."""
    if not directory.exists():
        try:
            directory.mkdir(mode=0o700, parents=True)
        except OSError as exc:
            raise ConfigError(
                f"{directory}: cannot create the status socket's directory: {exc.strerror}"
            ) from None
    st = directory.stat()
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(
            f"{directory}: not a directory; give the status socket a path in a private directory"
        )
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid != os.getuid() or mode & 0o077:
        raise ConfigError(
            f"{directory}: the status socket's directory must be private (yours, mode 0700), it is mode "
            f"{mode:04o} of uid {st.st_uid}; choose a private directory (mkdir -m 700 DIR)"
        )


def _alive(path: Path) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError:
        return False
    finally:
        probe.close()
    return True


def _has_sent(writer: asyncio.StreamWriter, reader: asyncio.StreamReader) -> bool:
    """Whether a client has sent something not read yet (in the reader's buffer or the socket's):
    such a client is about to be answered and is never the one evicted for a newcomer."""
    if getattr(reader, "_buffer", b""):
        return True
    sock = writer.get_extra_info("socket")
    try:
        pending = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
    except (OSError, AttributeError, ValueError):
        return False
    return int.from_bytes(pending, sys.byteorder) > 0


def status_of(node: Node, started: float) -> dict[str, Any]:
    """The answer to ``status``: the node's id, addresses, pid, uptime and ``node.stats()``
    (counters, queue depths, refusals by reason, ``peer_links``, ``peer_state``)."""
    return {
        "format": FORMAT,
        "agent_id": node.agent_id,
        "addresses": list(node.addresses),
        "pid": os.getpid(),
        "uptime_s": round(time.monotonic() - started, 3),
        "stats": dataclasses.asdict(node.stats()),
    }


class AdminSocket:
    """Serves :func:`status_of` on a UNIX socket while attached to a node: pass it as
    ``Node(metrics=...)`` or call :meth:`attach` after the node started. ``path``: the socket;
    None for :func:`default_path` of the node's AgentId."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self._path = Path(path) if path is not None else None
        self._node: Node | None = None
        self._sock: socket.socket | None = None
        self._server: asyncio.Server | None = None
        self._task: asyncio.Task[None] | None = None
        self._clients: set[asyncio.StreamWriter] = set()
        #: Clients whose request has not been read yet, oldest first.
        self._waiting: dict[asyncio.StreamWriter, asyncio.StreamReader] = {}
        self._started = 0.0
        self._inode: tuple[int, int] | None = None
        #: Clients closed unanswered because another uid ran them.
        self.refused = 0
        #: Clients closed because they sent no request while a new client needed their slot.
        self.evicted = 0

    @property
    def path(self) -> Path | None:
        """The socket's path (known once attached, when it was not given)."""
        return self._path

    def attach(self, node: Node) -> Callable[[], None]:
        """Bind the socket and serve on the running loop; the returned function stops serving and
        removes the socket. :class:`ConfigError` when the directory is not private or another
        process serves this path."""
        if self._node is not None:
            raise ConfigError("an AdminSocket serves one node: make one per node")
        path = self._path if self._path is not None else default_path(node.agent_id)
        private_dir(path.parent)
        if path.exists() or path.is_symlink():
            if not stat.S_ISSOCK(path.lstat().st_mode):
                raise ConfigError(f"{path}: exists and is not a socket; choose another status socket path")
            if _alive(path):
                raise ConfigError(
                    f"{path}: another node serves its status there; give this one another path (--admin PATH)"
                )
            path.unlink()  # a stale socket of a node that stopped
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(str(path))
            os.chmod(path, 0o600)  # the directory is private: nobody else reached it meanwhile
            sock.listen(MAX_CLIENTS)
        except OSError as exc:
            sock.close()
            raise ConfigError(f"{path}: cannot serve the status socket: {exc.strerror}") from None
        sock.setblocking(False)
        st = path.stat()
        self._inode = (st.st_dev, st.st_ino)
        self._path, self._sock, self._node = path, sock, node
        self._started = time.monotonic()
        self._task = asyncio.get_running_loop().create_task(self._serve(sock), name="iac-admin")
        return self._detach

    async def _serve(self, sock: socket.socket) -> None:
        self._server = await asyncio.start_unix_server(self._on_client, sock=sock, limit=MAX_REQUEST)
        await self._server.serve_forever()

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        uid = peer_uid(writer.get_extra_info("socket"))
        if uid is not None and uid != os.getuid():
            self.refused += 1
            log.warning(
                "status socket %s: refused a client of uid %d", self._path, uid, extra={"reason": "uid"}
            )
            writer.close()
            return
        if len(self._clients) >= MAX_CLIENTS:
            idle = next((w for w, r in self._waiting.items() if not _has_sent(w, r)), None)
            if idle is None:  # every slot is answering, or has its request: this client waits for none
                writer.close()
                return
            del self._waiting[idle]
            self._clients.discard(idle)
            self.evicted += 1
            idle.transport.abort()
        self._clients.add(writer)
        self._waiting[writer] = reader
        try:
            async with asyncio.timeout(READ_TIMEOUT):
                line = await reader.readline()
            self._waiting.pop(writer, None)
            if line.strip() == STATUS and self._node is not None:
                answer: dict[str, Any] = status_of(self._node, self._started)
            else:
                answer = {"format": FORMAT, "error": f"unknown request; send {STATUS.decode()!r}"}
            writer.write(json.dumps(answer, separators=(",", ":")).encode() + b"\n")
            await writer.drain()
        except (ValueError, asyncio.IncompleteReadError, TimeoutError, ConnectionError):
            pass
        finally:
            self._waiting.pop(writer, None)
            self._clients.discard(writer)
            writer.close()

    def _detach(self) -> None:
        if self._server is not None:
            self._server.close()
        elif self._sock is not None:
            self._sock.close()
        if self._task is not None:
            self._task.cancel()
        for writer in list(self._clients):
            with contextlib.suppress(Exception):
                writer.close()
        self._clients.clear()
        self._waiting.clear()
        path = self._path
        if path is not None and self._inode is not None:
            with contextlib.suppress(OSError):
                st = path.lstat()
                if (st.st_dev, st.st_ino) == self._inode:  # still ours, not a later node's
                    path.unlink()
        self._node = self._sock = self._server = self._task = None
        self._inode = None


def fetch_status(path: str | os.PathLike[str], timeout: float = 5.0) -> dict[str, Any]:
    """Ask the node serving ``path`` for its status (blocking). :class:`TransportError` naming the
    fix when nothing answers there. A connection closed before any answer (the node was busy with
    :data:`MAX_CLIENTS` others) is tried again, :data:`ATTEMPTS` times in all within ``timeout``."""
    deadline = time.monotonic() + timeout
    for attempt in range(1, ATTEMPTS + 1):
        answer = _fetch_once(path, max(deadline - time.monotonic(), 0.05))
        if not isinstance(answer, _Unanswered):
            return answer
        if attempt == ATTEMPTS or time.monotonic() + 0.05 * attempt >= deadline:
            raise TransportError(answer.why)
        time.sleep(0.05 * attempt)
    raise AssertionError("unreachable")  # pragma: no cover


@dataclasses.dataclass(frozen=True, slots=True)
class _Unanswered:
    """Closed before any answer (``why``): another attempt may be answered."""

    why: str


def _fetch_once(path: str | os.PathLike[str], timeout: float) -> dict[str, Any] | _Unanswered:
    p = Path(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    chunks: list[bytes] = []
    try:
        try:
            sock.connect(str(p))
        except FileNotFoundError:
            raise TransportError(
                f"{p}: no status socket there; is the node running? (`iac node` and `iac registry` "
                "serve one unless --no-admin)"
            ) from None
        except ConnectionRefusedError:
            raise TransportError(
                f"{p}: nobody serves this status socket (its node stopped); start the node again"
            ) from None
        except PermissionError:
            raise TransportError(
                f"{p}: permission denied; a status socket answers only its node's user "
                "(run iac status as that user)"
            ) from None
        except OSError as exc:
            raise TransportError(f"{p}: cannot connect ({exc.strerror}); check the path") from None
        try:
            sock.sendall(STATUS + b"\n")
            size = 0
            while chunk := sock.recv(65536):
                chunks.append(chunk)
                size += len(chunk)
                if size > MAX_ANSWER:
                    raise TransportError(f"{p}: the answer is larger than {MAX_ANSWER} bytes")
        except TimeoutError:
            raise TransportError(f"{p}: no answer within {timeout:g} s; the node is busy or stuck") from None
        except (BrokenPipeError, ConnectionResetError) as exc:
            if chunks:
                raise TransportError(f"{p}: the connection failed ({exc.strerror})") from None
            return _Unanswered(f"{p}: the connection failed ({exc.strerror})")
        except OSError as exc:
            raise TransportError(f"{p}: the connection failed ({exc.strerror})") from None
    finally:
        sock.close()
    if not chunks:
        return _Unanswered(
            f"{p}: the node closed the connection unanswered; it answers only its own user "
            "(run iac status as that user)"
        )
    try:
        answer = json.loads(b"".join(chunks))
    except ValueError:
        raise TransportError(f"{p}: the answer is not JSON; is this an IAC status socket?") from None
    if not isinstance(answer, dict) or "stats" not in answer:
        raise TransportError(f"{p}: unexpected answer ({str(answer)[:80]}); is this an IAC status socket?")
    return answer


__all__ = [
    "FORMAT",
    "MAX_CLIENTS",
    "MAX_REQUEST",
    "READ_TIMEOUT",
    "AdminSocket",
    "default_path",
    "fetch_status",
    "private_dir",
    "runtime_dir",
    "status_of",
]
