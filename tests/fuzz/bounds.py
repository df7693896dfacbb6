"""The bounds every fuzz input is held to, and the checked call that enforces them.

(a) Errors. Only the library's typed errors for the peer's fault escape a target
    (:class:`~iac.errors.PeerError` subclasses, plus what a target names besides), and each comes
    from the check that raises it: an error raised while handling another exception may stand for
    a parse failure of a library underneath (protobuf, zstd, JSON, Unicode, libsodium), never for
    a ``KeyError``, ``IndexError``, ``TypeError`` or ``AttributeError`` that a catch-all turned
    into a typed error. Anything else that escapes -- ``ValueError``, ``DecodeError``,
    ``RecursionError``, ``MemoryError`` ... -- is a finding, and so is an assertion of a target.
(b) Memory, measured as resident memory of the process (``/proc/self/statm``; libzstd and
    libsodium allocate outside ``tracemalloc``): one input may leave RSS at most
    :data:`RSS_GROWTH_PER_INPUT` higher than before it, and raise the peak (``VmHWM``, reset
    before each input through ``/proc/self/clear_refs``) at most :data:`PEAK_PER_INPUT` above
    the level it started from; over a run, RSS may grow at most :data:`RSS_GROWTH_PER_RUN` past
    its level after the first :data:`WARMUP_INPUTS` inputs (caches filling up, the fuzzer's own
    corpus).
(c) Time: one input takes at most :data:`TIME_PER_INPUT` seconds (libFuzzer's ``-timeout`` of
    :data:`tests.fuzz.run.HANG_TIMEOUT` seconds kills a hang that never returns).

Where ``/proc`` is missing the memory checks are skipped.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import nacl.exceptions
import zstandard
from google.protobuf.message import DecodeError

from iac.errors import IacError, PeerError

MiB = 1 << 20
TIME_PER_INPUT = 1.0
RSS_GROWTH_PER_INPUT = 16 * MiB
PEAK_PER_INPUT = 64 * MiB
RSS_GROWTH_PER_RUN = 64 * MiB
WARMUP_INPUTS = 200

#: Exceptions of the libraries underneath that a check may translate into a typed error.
TRANSLATED: tuple[type[BaseException], ...] = (
    DecodeError,
    zstandard.ZstdError,
    ValueError,  # json.JSONDecodeError, UnicodeError, int() of too many digits, an unknown enum value
    RecursionError,  # json.loads of deep nesting
    nacl.exceptions.CryptoError,
    OSError,  # the file receiver's disk
)
#: ... but never these, which only a catch-all would turn into a typed error.
NEVER_TRANSLATED: tuple[type[BaseException], ...] = (
    KeyError,
    IndexError,
    TypeError,
    AttributeError,
    AssertionError,
    MemoryError,
)


class Finding(AssertionError):
    """A bound did not hold for an input."""


def check_error(exc: IacError, allowed: tuple[type[IacError], ...] = (PeerError,)) -> None:
    """(a) for one error that a target let escape (or caught to go on): raise :class:`Finding`."""
    if not isinstance(exc, allowed):
        raise Finding(f"{type(exc).__name__} ({exc.reason}) is not the peer's fault: {exc}") from exc
    link: BaseException = exc
    while True:  # the first exception that is not a typed one is what the check caught
        inner = link.__cause__ or link.__context__
        if inner is None:
            return
        if not isinstance(inner, IacError):
            break
        link = inner
    if isinstance(inner, NEVER_TRANSLATED) or not isinstance(inner, TRANSLATED):
        raise Finding(
            f"{type(exc).__name__} was raised while handling {type(inner).__name__}: "
            "a catch-all turned an unexpected exception into a typed error"
        ) from exc


class _Memory:
    """Resident memory from /proc (None where there is none)."""

    def __init__(self) -> None:
        self.page = os.sysconf("SC_PAGE_SIZE")
        try:
            self._statm = os.open("/proc/self/statm", os.O_RDONLY)
            self._status = os.open("/proc/self/status", os.O_RDONLY)
        except OSError:
            self._statm = self._status = -1
        try:
            self._clear = os.open("/proc/self/clear_refs", os.O_WRONLY)
        except OSError:
            self._clear = -1

    def rss(self) -> int | None:
        if self._statm < 0:
            return None
        return int(os.pread(self._statm, 128, 0).split()[1]) * self.page

    def reset_peak(self) -> bool:
        if self._clear < 0:
            return False
        try:
            os.write(self._clear, b"5")
        except OSError:
            self._clear = -1
            return False
        return True

    def peak(self) -> int | None:
        if self._status < 0:
            return None
        text = os.pread(self._status, 4096, 0)
        i = text.find(b"VmHWM:")
        if i < 0:
            return None
        return int(text[i + 6 : text.index(b"kB", i)]) * 1024


@dataclass
class Stats:
    inputs: int = 0
    refused: int = 0
    slowest: float = 0.0
    max_growth: int = 0
    max_peak: int = 0
    baseline: int | None = None
    max_run_growth: int = 0
    errors: dict[str, int] = field(default_factory=dict)


class Checked:
    """Calls a target on one input and holds the input to the bounds (raises :class:`Finding`).

    An exception that is not an :class:`~iac.errors.IacError` propagates unchanged: for the
    fuzzer it is the crash. ``warmup``: inputs before the run's memory baseline is taken.
    """

    def __init__(
        self,
        fn: Callable[[bytes], None],
        allowed: tuple[type[IacError], ...] = (PeerError,),
        *,
        warmup: int = WARMUP_INPUTS,
        time_limit: float = TIME_PER_INPUT,
    ) -> None:
        self.fn = fn
        self.allowed = allowed
        self.warmup = warmup
        self.time_limit = time_limit
        self.stats = Stats()
        self._mem = _Memory()

    def __call__(self, data: bytes) -> None:
        mem, st = self._mem, self.stats
        before = mem.rss()
        peak_known = mem.reset_peak()
        start = time.perf_counter()
        try:
            self.fn(data)
        except IacError as exc:
            check_error(exc, self.allowed)
            st.refused += 1
            st.errors[exc.reason] = st.errors.get(exc.reason, 0) + 1
        elapsed = time.perf_counter() - start
        st.inputs += 1
        st.slowest = max(st.slowest, elapsed)
        if elapsed > self.time_limit:
            raise Finding(f"one input took {elapsed:.3f} s, above {self.time_limit} s")
        after = mem.rss()
        if before is None or after is None:
            return
        growth = after - before
        st.max_growth = max(st.max_growth, growth)
        if growth > RSS_GROWTH_PER_INPUT:
            raise Finding(
                f"RSS grew {growth / MiB:.1f} MiB on one input, above {RSS_GROWTH_PER_INPUT // MiB}"
            )
        peak = mem.peak() if peak_known else None
        if peak is not None:
            st.max_peak = max(st.max_peak, peak - before)
            if peak - before > PEAK_PER_INPUT:
                raise Finding(
                    f"RSS peaked {(peak - before) / MiB:.1f} MiB above its level before the input, "
                    f"above {PEAK_PER_INPUT // MiB}"
                )
        if st.baseline is None:
            if st.inputs >= self.warmup:
                st.baseline = after
        elif st.baseline is not None:
            run = after - st.baseline
            st.max_run_growth = max(st.max_run_growth, run)
            if run > RSS_GROWTH_PER_RUN:
                raise Finding(
                    f"RSS grew {run / MiB:.1f} MiB over the run after {self.warmup} inputs, "
                    f"above {RSS_GROWTH_PER_RUN // MiB} (input {st.inputs})"
                )

    def summary(self) -> str:
        st = self.stats
        return (
            f"{st.inputs} inputs ({st.refused} refused with a typed error), "
            f"slowest {st.slowest * 1e3:.1f} ms, "
            f"RSS per input +{st.max_growth / MiB:.2f} MiB (peak +{st.max_peak / MiB:.2f} MiB), "
            f"over the run +{st.max_run_growth / MiB:.2f} MiB"
        )
