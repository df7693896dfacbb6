"""The stores layer: where replay windows and registry rows are kept.

In memory, in a SQLite file (survives a restart, shared by the processes of a
host) or in Redis (shared by hosts). Each store implements an interface that
:mod:`iac.protocol` defines; nothing here knows about transports or the node.
"""

from iac.stores.memory import MemoryReplayStore
from iac.stores.records import open_record_store
from iac.stores.records_redis import RedisRecordStore
from iac.stores.records_sqlite import SqliteRecordStore
from iac.stores.redis import RedisReplayStore
from iac.stores.sqlite import SqliteReplayStore

__all__ = [
    "MemoryReplayStore",
    "RedisRecordStore",
    "RedisReplayStore",
    "SqliteRecordStore",
    "SqliteReplayStore",
    "open_record_store",
]
