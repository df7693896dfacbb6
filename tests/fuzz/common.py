"""What the targets share: the reader of fuzzed bytes, a builder of seeds in the same layout, and
the test vectors the seeds come from."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
VECTORS = ROOT / "proto" / "testvectors"
CORPUS = Path(__file__).resolve().parent / "corpus"

#: The largest frame the fuzzed decoders accept (a small node's setting; the bounds scale with it).
MAX_FRAME = 64 * 1024

__all__ = [
    "CORPUS",
    "MAX_FRAME",
    "ROOT",
    "VECTORS",
    "FuzzedDataProvider",
    "Layout",
    "PyDataProvider",
    "vectors",
]


class PyDataProvider:
    """The part of atheris' ``FuzzedDataProvider`` the targets use, in Python (libFuzzer's rules).

    Integers come from the end of the input, the last byte most significant, as many bytes as
    the range needs (fewer when the input runs out), reduced modulo the range's size; bytes
    come from the front. Replaying the corpus needs no fuzzer; ``tests/test_fuzz.py`` checks that
    both read every input alike.
    """

    def __init__(self, data: bytes) -> None:
        self._data = bytes(data)
        self._start = 0
        self._end = len(self._data)

    def remaining_bytes(self) -> int:
        return self._end - self._start

    def ConsumeBytes(self, count: int) -> bytes:
        count = max(0, min(count, self.remaining_bytes()))
        out = self._data[self._start : self._start + count]
        self._start += count
        return out

    def ConsumeIntInRange(self, lo: int, hi: int) -> int:
        span = hi - lo
        result = offset = 0
        while span >> offset and self._end > self._start:
            self._end -= 1
            result = (result << 8) | self._data[self._end]
            offset += 8
        return lo + result % (span + 1)


try:  # the fuzzer's own reader when it is there (it is faster); importing it starts nothing
    from atheris import FuzzedDataProvider
except ImportError:
    FuzzedDataProvider = PyDataProvider  # type: ignore[assignment,misc]


def int_width(lo: int, hi: int) -> int:
    """Bytes ``FuzzedDataProvider.ConsumeIntInRange(lo, hi)`` takes from the end of the input."""
    return ((hi - lo).bit_length() + 7) // 8


class Layout:
    """Builds an input the way a target reads it with :class:`FuzzedDataProvider`.

    The provider takes integers from the end of the input (the first one read is the last bytes,
    most significant byte last) and bytes from the front, so a seed is its byte parts in order
    followed by its integers in reverse order.
    """

    def __init__(self) -> None:
        self._front: list[bytes] = []
        self._ints: list[bytes] = []

    def int(self, value: int, lo: int, hi: int) -> Layout:
        """An integer the target reads with ``ConsumeIntInRange(lo, hi)``."""
        if not lo <= value <= hi:
            raise ValueError(f"{value} is outside [{lo}, {hi}]")
        self._ints.append((value - lo).to_bytes(int_width(lo, hi), "little"))
        return self

    def bytes(self, data: bytes) -> Layout:
        """Bytes the target reads with ``ConsumeBytes``."""
        self._front.append(bytes(data))
        return self

    def build(self) -> bytes:
        return b"".join(self._front) + b"".join(reversed(self._ints))


@cache
def vectors(name: str) -> dict[str, Any]:
    """One of the test-vector files, parsed (``v1``, ``mesh-v1``, ``records-v1``)."""
    data: dict[str, Any] = json.loads((VECTORS / f"{name}.json").read_text(encoding="utf-8"))
    return data
