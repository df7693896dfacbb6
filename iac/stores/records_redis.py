"""The registry's rows in Redis, shared by every registry on the same server and key prefix."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from iac.errors import ConfigError, StoreUnavailable
from iac.protocol.record_store import AgentRow, KeyState, RecordStoreTx, index_changes
from iac.stores.common import json_list, redis_client, str_tuple

if TYPE_CHECKING:
    import redis as redis_lib

_T = TypeVar("_T")


def _as_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    raise StoreUnavailable(f"registry store returned {type(value).__name__}")


def _as_str(value: Any) -> str:
    return _as_bytes(value).decode("utf-8")


class RedisRecordStore:
    """Rows in Redis, shared by every registry on the same server and ``key_prefix``.

    Layout: ``{prefix}:k:{agent_id}`` a hash per row, ``{prefix}:a:{alias}`` the
    owner of an alias, ``{prefix}:c:{capability}`` a sorted set of AgentIds scored
    by record expiry, ``{prefix}:keys`` every AgentId scored by record expiry.
    A transaction WATCHes every key it reads, buffers its writes and applies
    them in one MULTI/EXEC; if another registry changed a watched key meanwhile,
    the whole decision runs again (at most ``max_retries`` times).
    """

    def __init__(
        self,
        redis: str | redis_lib.Redis,
        *,
        key_prefix: str = "iac:registry",
        timeout_s: float = 2.0,
        max_retries: int = 16,
    ) -> None:
        if not key_prefix or any(c.isspace() for c in key_prefix):
            raise ConfigError("key_prefix must be a non-empty string without spaces")
        if max_retries < 1:
            raise ConfigError("max_retries must be at least 1")
        self._client, self._owns_client, self._errors = redis_client(
            redis, "RedisRecordStore", timeout_s=timeout_s
        )
        self._prefix = key_prefix
        self._max_retries = max_retries

    def key(self, kind: str, name: str = "") -> str:
        return f"{self._prefix}:{kind}:{name}" if name else f"{self._prefix}:{kind}"

    def atomic(self, fn: Callable[[RecordStoreTx], _T], *, write: bool = True) -> _T:
        errors = self._errors
        for _ in range(self._max_retries):
            pipe = self._client.pipeline(transaction=True)
            tx = _RedisTx(self, pipe)
            try:
                result = fn(tx)
                tx.commit()
                return result
            except errors.WatchError:
                continue
            except (errors.ConnectionError, errors.TimeoutError) as exc:
                raise StoreUnavailable(f"registry store (redis): {exc}") from None
            except errors.RedisError as exc:
                raise StoreUnavailable(f"registry store (redis): {exc}") from None
            finally:
                pipe.reset()
        raise StoreUnavailable(
            f"registry store (redis): gave up after {self._max_retries} conflicting retries"
        )

    def close(self) -> None:
        """Close the client if this store made it from a URL."""
        if self._owns_client:
            self._client.close()


_MISSING = object()


class _RedisTx:
    def __init__(self, store: RedisRecordStore, pipe: Any) -> None:
        self._s = store
        self._pipe = pipe
        self._rows: dict[str, AgentRow | None] = {}
        self._aliases: dict[str, str | None] = {}
        self._writes: list[Callable[[Any], None]] = []
        self._count_delta = 0  # rows added minus rows deleted by the buffered writes

    def _watch(self, key: str) -> None:
        self._pipe.watch(key)  # from the first WATCH on, the pipeline runs commands at once

    def get(self, agent_id: str) -> AgentRow | None:
        cached = self._rows.get(agent_id, _MISSING)
        if cached is not _MISSING:
            return cached  # type: ignore[return-value]
        key = self._s.key("k", agent_id)
        self._watch(key)
        row = _redis_row(agent_id, self._pipe.hgetall(key))
        self._rows[agent_id] = row
        return row

    def alias_owner(self, alias: str) -> str | None:
        if alias in self._aliases:
            return self._aliases[alias]
        key = self._s.key("a", alias)
        self._watch(key)
        value = self._pipe.get(key)
        owner = None if value is None else _as_str(value)
        self._aliases[alias] = owner
        return owner

    def with_capability(self, capability: str, now_us: int, limit: int) -> list[AgentRow]:
        ids = self._s._client.zrangebyscore(
            self._s.key("c", capability), f"({now_us}", "+inf", start=0, num=limit
        )
        rows = [self.get(_as_str(i)) for i in ids]
        return [r for r in rows if r is not None and r.expires_us > now_us]

    def count(self) -> int:
        key = self._s.key("keys")
        self._watch(key)
        return int(self._pipe.zcard(key)) + self._count_delta

    def purgeable(self, before_us: int, limit: int) -> list[AgentRow]:
        ids = self._s._client.zrangebyscore(self._s.key("keys"), "(0", f"({before_us}", start=0, num=limit)
        rows = [self.get(_as_str(i)) for i in ids]
        return [r for r in rows if r is not None and 0 < r.expires_us < before_us]

    def put(self, row: AgentRow) -> None:
        self._change(row.agent_id, row)

    def delete(self, agent_id: str) -> None:
        self._change(agent_id, None)

    def _change(self, agent_id: str, new: AgentRow | None) -> None:
        old = self.get(agent_id)
        unbind, bind, cap_rm, cap_add = index_changes(old, new)
        unbind = {a for a in unbind if self.alias_owner(a) == agent_id}
        s = self._s
        row_key = s.key("k", agent_id)

        def write(p: Any) -> None:
            p.delete(row_key)
            if new is None:
                p.zrem(s.key("keys"), agent_id)
            else:
                p.hset(row_key, mapping=_redis_fields(new))
                p.zadd(s.key("keys"), {agent_id: new.expires_us})
            for alias in unbind:
                p.delete(s.key("a", alias))
            for alias in bind:
                p.set(s.key("a", alias), agent_id)
            for cap in cap_rm:
                p.zrem(s.key("c", cap), agent_id)
            if new is not None:
                for cap in cap_add:
                    p.zadd(s.key("c", cap), {agent_id: new.expires_us})

        self._writes.append(write)
        self._count_delta += (new is not None) - (old is not None)
        self._rows[agent_id] = new
        for alias in unbind:
            self._aliases[alias] = None
        for alias in bind:
            self._aliases[alias] = agent_id

    def commit(self) -> None:
        if not self._writes:
            return
        self._pipe.multi()
        for write in self._writes:
            write(self._pipe)
        self._pipe.execute()


def _redis_fields(row: AgentRow) -> dict[str, bytes | str | int]:
    return {
        "seq": row.seq,
        "state": row.state.value,
        "successor": row.successor,
        "ended_us": row.ended_us,
        "next_key_digest": row.next_key_digest,
        "expires_us": row.expires_us,
        "record": row.record,
        "signature": row.signature,
        "proof": json_list(p.decode("ascii") for p in row.proof),
        "aliases": json_list(row.aliases),
        "capabilities": json_list(row.capabilities),
    }


def _redis_row(agent_id: str, h: dict[Any, Any]) -> AgentRow | None:
    if not h:
        return None
    f = {_as_str(k): _as_bytes(v) for k, v in h.items()}
    try:
        return AgentRow(
            agent_id=agent_id,
            seq=int(f["seq"]),
            state=KeyState(f["state"].decode()),
            successor=f["successor"].decode(),
            ended_us=int(f["ended_us"]),
            next_key_digest=f["next_key_digest"].decode(),
            expires_us=int(f["expires_us"]),
            record=f["record"],
            signature=f["signature"],
            proof=tuple(p.encode("ascii") for p in str_tuple(f["proof"])),
            aliases=str_tuple(f["aliases"]),
            capabilities=str_tuple(f["capabilities"]),
        )
    except (KeyError, ValueError) as exc:
        raise StoreUnavailable(f"registry store holds a malformed row for {agent_id[:16]}…: {exc}") from None
