"""Debugging aids for the encrypted transports: key logs and qlog.

* ``SSLKEYLOGFILE``: when this environment variable names a file, TLS (``ssl.SSLContext.keylog_filename``)
  and QUIC (the library's ``secrets_log_file``) append their session secrets to it, in the NSS key
  log format Wireshark reads (``CLIENT_HANDSHAKE_TRAFFIC_SECRET <client random> <secret>``, ...).
  Anyone who can read that file can decrypt the captured traffic: it is created with mode 0600,
  and a WARNING says it is on (once per process and file).
* ``TransportConfig.qlog_dir``: one qlog file (JSON, for qvis) per QUIC connection in that
  directory, named ``<original destination connection id>_<client|server>.qlog``, written when the
  connection ends (and, for connections still open, when the process exits).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import logging
import os
import ssl
import tempfile
import threading
from pathlib import Path
from typing import Any, TextIO

from iac.errors import ConfigError

log = logging.getLogger("iac.transport")

#: The environment variable that names the key log file.
KEYLOG_ENV = "SSLKEYLOGFILE"

_lock = threading.Lock()
_warned: set[str] = set()
_secrets: dict[str, TextIO] = {}
_qlogs: dict[tuple[str, str], QlogWriter] = {}


def keylog_path() -> str | None:
    """The key log file ``SSLKEYLOGFILE`` names (created mode 0600), or None; warns once per file."""
    path = os.environ.get(KEYLOG_ENV)
    if not path:
        return None
    with _lock:
        if path not in _warned:
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
            except OSError as exc:
                raise ConfigError(
                    f"{KEYLOG_ENV}={path}: cannot write the key log ({exc.strerror}); unset it or name a "
                    "writable file"
                ) from None
            _warned.add(path)
            log.warning(
                "%s is set: TLS and QUIC session secrets are written to %s; whoever reads that file can "
                "decrypt captured traffic (unset it when done debugging)",
                KEYLOG_ENV,
                path,
            )
    return path


def set_tls_keylog(ctx: ssl.SSLContext) -> None:
    """Log ``ctx``'s session secrets to ``SSLKEYLOGFILE`` when it is set."""
    path = keylog_path()
    if path is not None:
        ctx.keylog_filename = path


def _secrets_file(path: str) -> TextIO:
    with _lock:
        f = _secrets.get(path)
        if f is None or f.closed:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            f = _secrets[path] = os.fdopen(fd, "a", buffering=1, encoding="ascii")
            atexit.register(f.close)
        return f


class QlogWriter:
    """A QUIC logger (the library's ``quic_logger``) that writes one qlog file per connection into
    ``directory`` when the connection ends; :meth:`flush` writes the connections still open."""

    def __init__(self, directory: str | os.PathLike[str], library: str = "aioquic") -> None:
        self.directory = Path(directory)
        module = importlib.import_module(f"{library}.quic.logger")
        self._trace_class: Any = module.QuicLoggerTrace
        self._version: str = getattr(module, "QLOG_VERSION", "0.3")
        self._open: list[Any] = []
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"qlog_dir {self.directory}: cannot create it ({exc.strerror})") from None

    def start_trace(self, is_client: bool, odcid: bytes) -> Any:
        trace = self._trace_class(is_client=is_client, odcid=odcid)
        self._open.append(trace)
        return trace

    def end_trace(self, trace: Any) -> None:
        with contextlib.suppress(ValueError):
            self._open.remove(trace)
        data = trace.to_dict()
        vantage = data.get("vantage_point", {}).get("type", "endpoint")
        name = f"{data.get('common_fields', {}).get('ODCID', 'connection')}_{vantage}.qlog"
        body = {"qlog_format": "JSON", "qlog_version": self._version, "traces": [data]}
        try:
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".qlog-")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(body, f)
            os.replace(tmp, self.directory / name)
        except OSError as exc:
            log.warning("qlog %s: cannot write it: %s", self.directory / name, exc)

    def flush(self) -> None:
        """Write the qlog of every connection still open (what it logged so far)."""
        for trace in list(self._open):
            self.end_trace(trace)


def qlog_writer(directory: str, library: str) -> QlogWriter:
    """The :class:`QlogWriter` of ``directory`` (one per directory and library, flushed at exit)."""
    key = (os.path.abspath(directory), library)
    with _lock:
        writer = _qlogs.get(key)
        if writer is None:
            writer = _qlogs[key] = QlogWriter(directory, library)
            atexit.register(writer.flush)
        return writer


def set_quic_debugging(qc: Any, qlog_dir: str | None) -> None:
    """Set the library's QUIC configuration ``qc`` to log secrets (``SSLKEYLOGFILE``) and qlog
    (``qlog_dir``) when asked."""
    path = keylog_path()
    if path is not None:
        qc.secrets_log_file = _secrets_file(path)
    if qlog_dir is not None:
        library = type(qc).__module__.split(".", 1)[0]
        qc.quic_logger = qlog_writer(qlog_dir, library)


__all__ = ["KEYLOG_ENV", "QlogWriter", "keylog_path", "qlog_writer", "set_quic_debugging", "set_tls_keylog"]
