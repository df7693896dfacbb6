"""What a results file says about where it was measured: machine, Python, libraries, QUIC backends, commit."""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from iac.bench.harness.paths import ROOT

#: The distribution a library is installed as, where its name differs (``iac`` is ``iac-mesh``).
DISTRIBUTIONS = {"iac": "iac-mesh"}
LIBRARIES = ("iac", "aioquic", "qh3", "pynacl", "zstandard", "protobuf", "aiohttp", "grpcio", "matplotlib")


def quic_backends() -> list[str]:
    """QUIC backends to run the QUIC scenarios on: aioquic always, then each accelerated backend
    (qh3) that IAC's backend switch finds installed. The name reaches the endpoints as
    ``IAC_QUIC_BACKEND``."""
    from iac.transport.quic import backend

    found = [b for b in backend.available() if b in backend.BACKENDS and b != "aioquic"]
    return ["aioquic", *found]


def quic_name(backend: str) -> str:
    return "IAC-QUIC" if backend == "aioquic" else f"IAC-QUIC[{backend}]"


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def git(*args: str, timeout: float = 10) -> subprocess.CompletedProcess[str] | None:
    """``git -C ROOT args…``, or None when git cannot be run."""
    try:
        argv = ["git", "-C", str(ROOT), *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None


def environment(libraries: tuple[str, ...] = LIBRARIES) -> dict[str, Any]:
    libs: dict[str, str | None] = {}
    for name in libraries:
        try:
            libs[name] = importlib.metadata.version(DISTRIBUTIONS.get(name, name))
        except importlib.metadata.PackageNotFoundError:
            libs[name] = None
    with contextlib.suppress(ImportError):
        from google.protobuf.internal import api_implementation

        libs["protobuf_backend"] = api_implementation.Type()
    r = git("rev-parse", "--short", "HEAD", timeout=5)
    commit = (r.stdout.strip() or None) if r is not None else None
    return {
        "cpu_model": cpu_model(),
        "cores": os.cpu_count(),
        "machine": platform.machine(),
        "system": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "libraries": libs,
        "quic_backends": quic_backends(),
        "git_commit": commit,
    }
