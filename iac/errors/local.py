"""Local faults: the caller misused the API, the configuration is wrong, or this side failed."""

from __future__ import annotations

from iac.errors.base import IacError


class LocalError(IacError):
    """This side failed, not the peer nor the network: a worker thread, the file being sent,
    a child process it runs, a state machine driven out of order (``reason`` says which)."""

    name = "local_error"


class ConfigError(LocalError):
    """A configuration value, an argument or a key file is invalid: fix it and call again.

    ``reason`` is ``config_error``, or ``key_file_error`` for a key file that is missing,
    malformed or has unsafe permissions.
    """

    name = "config_error"


class DiskError(LocalError):
    """Reading or writing a file of this side failed (a full disk, a permission, a vanished
    directory); ``path`` names the file or directory."""

    name = "disk_error"

    def __init__(self, message: str, path: str = "", *, reason: str | None = None) -> None:
        super().__init__(message, reason=reason)
        self.path = path
