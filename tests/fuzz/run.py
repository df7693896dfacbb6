"""Run one fuzz target under atheris: ``python -m tests.fuzz.run TARGET [libFuzzer options] [DIR ...]``.

The modules the target names are instrumented for coverage; every input goes through
:class:`~tests.fuzz.bounds.Checked`, so a broken bound is a crash for libFuzzer (it saves the
input and stops). Unless given, ``-max_len`` is the target's, ``-timeout`` is
:data:`HANG_TIMEOUT` and ``-dict`` is ``tests/fuzz/tokens/<target>.dict`` when there is one.
libFuzzer adds the inputs it finds to the first directory given; pass a scratch directory first
and the committed corpus after it. An input that breaks a bound is saved under
``build/fuzz/crashes/``.

At the end (``-runs`` or ``-max_total_time`` reached) it prints one line with the bounds it
measured, starting with ``iac-fuzz:``.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable
from pathlib import Path

import atheris

from tests.fuzz.instrument import INSTRUMENT

#: Where libFuzzer saves an input that broke a bound, unless ``-artifact_prefix`` says otherwise.
CRASHES = Path(__file__).resolve().parents[2] / "build" / "fuzz" / "crashes"
#: libFuzzer dictionaries (``-dict``): tokens of a target's input format that mutations insert.
TOKENS = Path(__file__).resolve().parent / "tokens"
#: libFuzzer's -timeout (seconds) unless given: kills an input that never returns.
HANG_TIMEOUT = 10


def _modules_outside(keep: tuple[str, ...]) -> list[str]:
    """Every module of the ``iac`` package that is not under ``keep`` (found on disk, not imported)."""
    root = Path(__file__).resolve().parents[2] / "iac"
    names = []
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if not any(name == k or name.startswith(k + ".") for k in keep):
            names.append(name)
    return names


_C_EXIT_HANDLERS: list[object] = []


def _at_c_exit(fn: Callable[[], None]) -> None:
    """Call ``fn`` when the C library's ``exit`` runs (``__cxa_atexit``, as ``atexit(3)`` does)."""
    register = getattr(ctypes.CDLL(None), "__cxa_atexit", None)
    if register is None:
        return
    handler = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda _arg: fn())
    _C_EXIT_HANDLERS.append(handler)  # kept alive until the process ends
    register(handler, None, None)


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[1].startswith("-"):
        sys.exit(f"usage: {argv[0]} TARGET [libFuzzer options] [corpus directories]")
    target_name = argv[1]
    if target_name not in INSTRUMENT:
        sys.exit(f"unknown target {target_name!r}; targets: {', '.join(INSTRUMENT)}")
    # Nothing of iac is imported yet: the hook instruments the target's modules as they load.
    with atheris.instrument_imports(include=["iac"], exclude=_modules_outside(INSTRUMENT[target_name])):
        from tests.fuzz.bounds import Checked
        from tests.fuzz.targets import TARGETS

    target = TARGETS[target_name]
    checked = Checked(target.run, target.allowed)
    options = argv[2:]
    if not any(o.startswith("-max_len=") for o in options):
        options.insert(0, f"-max_len={target.max_len}")
    if not any(o.startswith("-timeout=") for o in options):
        options.insert(0, f"-timeout={HANG_TIMEOUT}")
    tokens = TOKENS / f"{target_name}.dict"
    if tokens.exists() and not any(o.startswith("-dict=") for o in options):
        options.insert(0, f"-dict={tokens}")
    if not any(o.startswith("-artifact_prefix=") for o in options):
        CRASHES.mkdir(parents=True, exist_ok=True)
        options.insert(0, f"-artifact_prefix={CRASHES}/{target_name}-")

    def report() -> None:
        print(f"iac-fuzz: {target_name}: {checked.summary()}", file=sys.stderr, flush=True)

    # libFuzzer ends the process with exit(3), which skips Python's atexit: register with the C library.
    _at_c_exit(report)
    atheris.Setup([argv[0], *options], checked)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
