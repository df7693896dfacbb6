"""The fuzz targets, by name. Each module has ``TestOneInput(data)``, the ``parse`` of an input into
what the target does with it, the ``layout`` that builds an input back from that, and the
``seeds`` made from the test vectors."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

from iac.errors import IacError, PeerError
from tests.fuzz.instrument import INSTRUMENT
from tests.fuzz.targets import dicts, files, forward, frames, hello, message, records


@dataclass(frozen=True)
class Target:
    name: str
    module: ModuleType
    #: Largest input libFuzzer makes (``-max_len``).
    max_len: int = 8192

    @property
    def run(self) -> Callable[[bytes], None]:
        fn: Callable[[bytes], None] = self.module.TestOneInput
        return fn

    @property
    def seeds(self) -> Callable[[], dict[str, bytes]]:
        fn: Callable[[], dict[str, bytes]] = self.module.seeds
        return fn

    @property
    def instrument(self) -> tuple[str, ...]:
        """The modules whose coverage guides the fuzzer (the rest runs uninstrumented)."""
        return INSTRUMENT[self.name]

    @property
    def allowed(self) -> tuple[type[IacError], ...]:
        """The errors that may escape: the peer's fault, and what the target names besides."""
        names: tuple[type[IacError], ...] = getattr(self.module, "ALLOWED", (PeerError,))
        return names


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("frames", frames, max_len=16384),
        Target("message", message),
        Target("hello", hello),
        Target("forward", forward, max_len=16384),
        Target("records", records),
        Target("files", files, max_len=16384),
        Target("dict", dicts, max_len=16384),
    )
}

__all__ = ["TARGETS", "Target"]
