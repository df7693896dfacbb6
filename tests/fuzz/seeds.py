"""Write the seed files of the committed corpus from the test vectors.

``python -m tests.fuzz.seeds`` rewrites every ``tests/fuzz/corpus/<target>/seed-*`` file (and
removes seeds that no longer exist); the inputs that once broke a bound (``crash-*``) stay.
Seeds are deterministic: the same vectors give the same files.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from tests.fuzz.common import CORPUS
from tests.fuzz.targets import TARGETS


def seed_files(target: str) -> dict[str, bytes]:
    """``{file name: input}`` of one target's seeds."""
    out: dict[str, bytes] = {}
    for name, data in TARGETS[target].seeds().items():
        slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
        if f"seed-{slug}" in out:
            raise ValueError(f"two seeds of {target} are both named {slug!r}")
        out[f"seed-{slug}"] = data
    return out


def write(corpus: Path = CORPUS) -> int:
    n = 0
    for target in TARGETS:
        folder = corpus / target
        folder.mkdir(parents=True, exist_ok=True)
        files = seed_files(target)
        for old in folder.glob("seed-*"):
            if old.name not in files:
                old.unlink()
        for name, data in files.items():
            path = folder / name
            if not path.exists() or path.read_bytes() != data:
                path.write_bytes(data)
                n += 1
    return n


if __name__ == "__main__":
    print(f"{write()} seed files written")
    sys.exit(0)
