"""Open a registry's record store from a spec string (the CLI's ``--store``)."""

from __future__ import annotations

from iac.errors import ConfigError
from iac.protocol.record_store import MemoryRecordStore, RecordStore
from iac.stores.records_redis import RedisRecordStore
from iac.stores.records_sqlite import SqliteRecordStore


def open_record_store(spec: str) -> RecordStore:
    """A store from a CLI-style spec: ``memory``, ``sqlite:PATH`` or ``redis://HOST:PORT[/DB]``."""
    if spec == "memory":
        return MemoryRecordStore()
    if spec.startswith("sqlite:"):
        path = spec.removeprefix("sqlite:")
        if not path:
            raise ConfigError("sqlite: needs a path (sqlite:registry.db)")
        return SqliteRecordStore(path)
    if spec.startswith(("redis://", "rediss://", "unix://")):
        return RedisRecordStore(spec)
    raise ConfigError(f"{spec!r}: not a registry store (memory, sqlite:PATH, redis://HOST:PORT)")
