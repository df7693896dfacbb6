"""Checks of the ``iac`` command's arguments that need more than their text: key files, AgentIds,
registry specs, addresses, files to write, UNIX socket directories, and what a listener's failure
means. Each failure is a :class:`~iac.errors.ConfigError` whose text names the flag and the fix.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import socket
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path

from iac.errors import ConfigError, IacError
from iac.mesh import RegistryAddr, parse_registry
from iac.transport.base import Address, parse_address
from iac.wire.identity import Identity, is_agent_id

#: What an AgentId is, in the words of every message that refuses one.
AGENT_ID_TEXT = "64 lowercase hex digits of an Ed25519 public key"
_ADDRESS_FORMS = "quic://HOST:PORT, tls://HOST:PORT or unix:///DIR/NAME.sock"


def agent_id(flag: str, value: str) -> str:
    """``value`` if it is an AgentId (a valid Ed25519 public key, not only 64 hex digits)."""
    if not is_agent_id(value):
        raise ConfigError(
            f"{flag} {value!r:.90}: not a valid AgentId ({AGENT_ID_TEXT}); `iac id --key FILE` prints "
            "the AgentId of a key"
        )
    return value


def address(flag: str, url: str) -> Address:
    """A transport URL, parsed."""
    try:
        return parse_address(url)
    except ConfigError:
        raise ConfigError(f"{flag} {url!r:.90}: not an address; give {_ADDRESS_FORMS}") from None


def registries(specs: Sequence[str], flag: str = "--registry") -> list[RegistryAddr]:
    """The registries of ``--registry AGENT_ID@URL`` options."""
    for spec in specs:
        aid, sep, url = spec.partition("@")
        if not sep:
            raise ConfigError(
                f"{flag} {spec!r:.90}: give AGENT_ID@URL, the registry's AgentId, '@' and its address "
                "(e.g. `iac id --key reg.key`@tls://127.0.0.1:7000)"
            )
        agent_id(f"{flag} AGENT_ID@URL: the part before '@',", aid)
        address(f"{flag} AGENT_ID@URL: the part after '@',", url)
    return parse_registry(specs)


# --- key files ------------------------------------------------------------------------------------


def load_key(path: str, flag: str = "--key") -> Identity:
    """The identity in a key file, with a message naming the fix for each way it can be wrong."""
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise ConfigError(
            f"{flag} {path}: no such key file; create one with `iac keygen --out {path}`"
        ) from None
    except OSError as exc:
        raise ConfigError(
            f"{flag} {path}: cannot read it ({exc.strerror}); check the path and its permissions"
        ) from None
    if stat.S_ISDIR(st.st_mode):
        raise ConfigError(
            f"{flag} {path}: is a directory; give the key file in it (`iac keygen --out {p / 'agent.key'}` "
            "makes one)"
        )
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{flag} {path}: not a regular file; give a key file made by `iac keygen`")
    if st.st_mode & 0o077 == 0:
        try:
            with p.open("rb") as f:
                head = f.read(4096)
        except OSError as exc:
            raise ConfigError(
                f"{flag} {path}: cannot read it ({exc.strerror}); check its permissions"
            ) from None
        if not head.isascii():
            raise ConfigError(
                f"{flag} {path}: not an IAC key file (it holds binary data, a key file is text); "
                f"give the file `iac keygen --out FILE` wrote"
            )
    return Identity.load(p)  # its own messages name the fix: chmod 600, the expected line


# --- files and directories ------------------------------------------------------------------------


def output_file(flag: str, path: str, *, force: bool, example: str = "out", lost: str = "") -> Path:
    """A file about to be written: not a directory, in a directory that exists, and not there
    already unless ``force`` (``lost``: what replacing it loses, for the message)."""
    p = _file_in_a_directory(flag, path, example)
    if p.exists() and not force:
        raise ConfigError(
            f"{flag} {path}: already exists; add --force to replace it{lost}, or choose another name"
        )
    return p


def tickets_file(path: str | None, flag: str = "--tickets") -> Path | None:
    """A session ticket file: read if it is there, written (mode 0600) as tickets come; its
    directory must exist, and it must not be a directory or readable by others."""
    if path is None:
        return None
    p = _file_in_a_directory(flag, path, "tickets.json")
    if p.exists() and p.stat().st_mode & 0o077:
        raise ConfigError(
            f"{flag} {path}: readable by others; session tickets are secret like a key (chmod 600 {path})"
        )
    return p


def _file_in_a_directory(flag: str, path: str, example: str) -> Path:
    """``path`` names a file (not a directory) in a directory that exists."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{flag} {path}: is a directory; name the file to write, e.g. {flag} {p / example}")
    parent = p.parent
    if not parent.is_dir():
        what = "is not a directory" if parent.exists() else "does not exist"
        raise ConfigError(f"{flag} {path}: {parent} {what}; create the directory first (mkdir -p {parent})")
    return p


def output_dir(flag: str, path: str) -> Path:
    """A directory to write into (created if missing): not an existing file."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ConfigError(
            f"{flag} {path}: is a file, not a directory; give a directory (it is created if missing)"
        )
    return p


def private_dir(flag: str, value: str, directory: Path) -> None:
    """A UNIX socket's directory: missing (then it is created with mode 0700), or a directory of
    this user that group and others cannot enter."""
    try:
        st = directory.stat()
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{flag} {value}: {directory} is not a directory; put the socket in a directory")
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid != os.getuid() or mode & 0o077:
        whose = "" if st.st_uid == os.getuid() else f", owned by uid {st.st_uid}"
        raise ConfigError(
            f"{flag} {value}: the socket's directory {directory} is mode {mode:04o}{whose}, and a UNIX "
            "socket must be in a private directory (mode 0700, yours); use one of its own, e.g. "
            f"`mkdir -m 700 ~/iac-sock` and {flag} unix://$HOME/iac-sock/{Path(value).name or 'node.sock'}"
        )


def _socket_in_use(path: Path) -> bool:
    try:
        if not stat.S_ISSOCK(path.lstat().st_mode):
            return False
    except OSError:
        return False
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError:
        return False
    finally:
        probe.close()
    return True


def _in_use(url: str) -> ConfigError:
    return ConfigError(
        f"--listen {url}: the address is in use (another process listens there); choose another "
        "address or port (port 0 picks a free one), or stop that process"
    )


def listen_urls(urls: Sequence[str]) -> list[str]:
    """``--listen`` values: each an address; a UNIX socket in a private directory and not in use."""
    for url in urls:
        addr = address("--listen", url)
        if addr.scheme == "unix":
            path = Path(addr.path)
            if path.is_dir():
                raise ConfigError(
                    f"--listen {url}: is a directory; name the socket in it, e.g. unix://{path / 'node.sock'}"
                )
            private_dir("--listen", url, path.parent)
            if path.exists() and not stat.S_ISSOCK(path.lstat().st_mode):
                raise ConfigError(f"--listen {url}: {path} exists and is not a socket; choose another path")
            if _socket_in_use(path):
                raise _in_use(url)
    return list(urls)


_URL_RE = re.compile(r"(?:quic|tls|unix)://[^\s:]*(?::\d+)?")


@contextlib.contextmanager
def listen_errors(urls: Sequence[str], metrics: str | None = None) -> Iterator[None]:
    """Turn a listener's "address in use" (worded by each transport its own way) into one message
    naming the ``--listen`` address, or the ``--metrics`` one (the endpoint ``metrics`` serves
    on), and the fix."""
    try:
        yield
    except IacError as exc:
        cause: BaseException | None = exc
        while cause is not None:
            if isinstance(cause, OSError) and cause.errno == errno.EADDRINUSE:
                found = _URL_RE.search(str(exc))
                if found is None and metrics is not None and str(exc).startswith("metrics endpoint"):
                    raise ConfigError(
                        f"--metrics {metrics}: the address is in use (another process listens there); "
                        "choose another port (port 0 picks a free one), or stop that process"
                    ) from None
                url = next((u for u in urls if found and u.startswith(found.group(0))), None)
                raise _in_use(url or (found.group(0) if found else " ".join(urls))) from None
            cause = cause.__cause__ or cause.__context__
        raise


__all__ = [
    "AGENT_ID_TEXT",
    "address",
    "agent_id",
    "listen_errors",
    "listen_urls",
    "load_key",
    "output_dir",
    "output_file",
    "private_dir",
    "registries",
]
