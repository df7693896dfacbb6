"""Files only this user may read, written and read back safely: the one way the library writes a
key, a session ticket file, a certificate key, a counter or a transfer's state.

:func:`write_private` writes into a fresh temporary file in the same directory (a random name,
``O_CREAT | O_EXCL | O_NOFOLLOW``, mode 0600: a file or a symbolic link planted there is never
written through, and a planted file's mode is never kept), then renames it over the target, so a
reader sees the old content or the new, never a part. :func:`read_private` reads a file back only
when it is a regular file (not a link), owned by this user, not open to group or others and not
larger than asked.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

from iac.errors import ConfigError

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def write_private(
    path: str | os.PathLike[str],
    data: bytes,
    *,
    overwrite: bool = True,
    tmp: str | os.PathLike[str] | None = None,
) -> None:
    """Write ``data`` to ``path`` (mode 0600) through a fresh temporary file and a rename.

    ``tmp``: the temporary file's path, for a caller that finds its leftovers by name (whatever is
    there is removed first, then created anew); default a random name beside ``path``. Without
    ``overwrite`` an existing ``path`` (a link included) raises :class:`FileExistsError` and is
    left as it was. Other failures raise :class:`OSError`; the temporary file is removed.
    """
    p = Path(path)
    if tmp is None:
        tmp = p.with_name(f".{p.name}.{secrets.token_hex(8)}.tmp")
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o600)
    try:
        try:
            os.fchmod(fd, 0o600)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        if overwrite:
            os.replace(tmp, p)
        else:
            os.link(tmp, p, follow_symlinks=False)  # fails, atomically, when p exists
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def read_private(path: str | os.PathLike[str], max_size: int) -> bytes:
    """The content of ``path``, a regular file of this user's that group and others cannot open,
    at most ``max_size`` bytes. :class:`FileNotFoundError` when it is not there; :class:`ConfigError`
    saying what is wrong with it (a link, another owner, its mode, its size); :class:`OSError`."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | _NOFOLLOW | _CLOEXEC | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        if _NOFOLLOW and p.is_symlink():
            raise ConfigError(f"{p}: is a symbolic link; a private file is a regular file") from None
        raise exc from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{p}: not a regular file")
        if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
            raise ConfigError(f"{p}: owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})")
        if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ConfigError(
                f"{p}: open to group or others (mode {stat.S_IMODE(st.st_mode):04o}); "
                f"it must be private (chmod 600 {p})"
            )
        if st.st_size > max_size:
            raise ConfigError(f"{p}: {st.st_size} bytes, larger than the {max_size} bytes allowed")
        chunks: list[bytes] = []
        size = 0
        while chunk := os.read(fd, 65536):
            size += len(chunk)
            if size > max_size:
                raise ConfigError(f"{p}: larger than the {max_size} bytes allowed")
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


__all__ = ["read_private", "write_private"]
