"""Where the suite finds its corpus, and where a checkout keeps its committed results.

The corpus ships inside the package (``iac/bench/corpus``). ``ROOT`` is the directory that holds
the ``iac`` package: in a source checkout the repository (with ``benchmarks/results/`` and the
READMEs the report renderers rewrite); in an installed distribution ``site-packages``, where
those do not exist and only ``iac bench`` itself is used.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]
CORPUS = PACKAGE / "corpus"
TEST_CORPUS = CORPUS / "test.jsonl"
ROOT = PACKAGE.parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def child_env(backend: str | None = None) -> dict[str, str]:
    """The environment for a child Python of the suite: it imports this same ``iac`` (its
    directory first on ``PYTHONPATH``), and ``IAC_QUIC_BACKEND`` is ``backend`` when given."""
    env = dict(os.environ)
    root = str(ROOT)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if backend:
        env["IAC_QUIC_BACKEND"] = backend
    return env


def module_argv(module: str, *args: str) -> list[str]:
    """``python -m module args…`` with this interpreter."""
    return [sys.executable, "-m", module, *args]
