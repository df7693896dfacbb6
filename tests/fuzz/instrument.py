"""Per target, the modules whose coverage guides the fuzzer (the rest of ``iac`` runs uninstrumented,
which keeps start-up short). Apart from the target modules so that the fuzz runner knows them
before it imports anything of ``iac``."""

from __future__ import annotations

INSTRUMENT: dict[str, tuple[str, ...]] = {
    "frames": ("iac.wire.frames", "iac.wire.scan", "iac.wire.dicts"),
    "message": ("iac.wire.message", "iac.wire.scan", "iac.wire.frames", "iac.wire.identity"),
    "hello": ("iac.protocol.handshake", "iac.wire.message", "iac.wire.scan", "iac.wire.identity"),
    "forward": ("iac.protocol.routing", "iac.protocol.replay", "iac.wire.scan", "iac.wire.identity"),
    "records": (
        "iac.protocol.records",
        "iac.protocol.statements",
        "iac.protocol.canonical",
        "iac.wire.identity",
    ),
    "files": ("iac.protocol.files",),
    "dict": ("iac.transport.session", "iac.wire.dicts"),
}
