"""Local faults: the caller misused the API or gave a bad configuration."""

from __future__ import annotations

from iac.errors.base import IacError


class LocalError(IacError):
    """The caller misused the API or gave a bad configuration."""

    name = "local_error"


class ConfigError(LocalError):
    """A configuration value or argument is invalid."""

    name = "config_error"


class KeyFileError(LocalError):
    """A key file is missing, malformed or has unsafe permissions."""

    name = "key_file_error"


class WorkerFailed(LocalError):
    """A worker thread of this side failed (not a verdict on any message): what it was doing is
    not done, and the caller sees this error instead of waiting forever."""

    name = "worker_failed"


class DiskError(LocalError):
    """Reading or writing a file of this side failed (a full disk, a permission, a vanished
    directory); ``path`` names the file or directory."""

    name = "disk_error"

    def __init__(self, message: str, path: str = "") -> None:
        super().__init__(message)
        self.path = path


class SourceChanged(LocalError):
    """The file being sent changed size while it was sent."""

    name = "source_changed"


class McpChildFailed(LocalError):
    """The stdio MCP server a bridge runs exited, wrote what is not JSON-RPC, or did not answer
    ``initialize`` in time (``iac mcp serve --stdio``)."""

    name = "mcp_child_failed"
