"""``python -m iac.bench``: the benchmark suite (the same as ``iac bench``)."""

from __future__ import annotations

import sys

from iac.bench.main import run

if __name__ == "__main__":
    sys.exit(run())
