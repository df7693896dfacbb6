"""Server session tickets, as opaque bytes, and what a 0-RTT cluster must share. Sans-IO.

A QUIC server keeps the state of every session ticket it issued (the resumption
secret, and in CA mode the client certificate chain it verified) under the
ticket's label. docs/PROTOCOL.md, "0-RTT and tickets": every ticket is
single-use, so the lookup that resumes a session *takes* the ticket out, in one
atomic step; a captured early flight replayed later finds nothing to resume.

* :class:`TicketStore` is the interface; ``shared`` says whether several
  processes or hosts see the same tickets (a cluster of servers with one
  identity that resume each other's sessions).
* :class:`MemoryTicketStore` is the in-memory store (one process);
  :mod:`iac.stores.tickets` has SQLite and Redis ones.
* :func:`check_cluster_stores`: servers that share tickets must also share the
  replay store and the HELLO nonce cache, or a replayed early flight sent to a
  second server would run twice.

The blobs are secrets (they hold resumption secrets): a shared store must be as
private as the node's key.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol, runtime_checkable

from iac.errors import ConfigError

DEFAULT_MAX_TICKETS = 65536


@runtime_checkable
class TicketStore(Protocol):
    """Where a server keeps the tickets it issued, by label; each is taken at most once."""

    @property
    def shared(self) -> bool:
        """True if other processes or hosts can take the tickets this one puts (SQLite, Redis)."""
        ...

    def put(self, label: bytes, blob: bytes, expires_at_us: int, now_us: int) -> None:
        """Keep ``blob`` under ``label`` until ``expires_at_us``."""
        ...

    def take(self, label: bytes, now_us: int) -> bytes | None:
        """Remove and return the blob under ``label`` (None if absent or expired), atomically:
        of two servers taking the same label, one gets it."""
        ...


class MemoryTicketStore:
    """Tickets in this process's memory, oldest dropped first beyond ``max_entries``."""

    shared = False

    def __init__(self, max_entries: int = DEFAULT_MAX_TICKETS) -> None:
        if max_entries < 1:
            raise ConfigError("max_entries must be positive")
        self.max_entries = max_entries
        self._tickets: OrderedDict[bytes, tuple[bytes, int]] = OrderedDict()

    def put(self, label: bytes, blob: bytes, expires_at_us: int, now_us: int) -> None:
        self._tickets.pop(label, None)
        self._tickets[label] = (blob, expires_at_us)
        while len(self._tickets) > self.max_entries:
            self._tickets.popitem(last=False)

    def take(self, label: bytes, now_us: int) -> bytes | None:
        item = self._tickets.pop(label, None)
        if item is None or item[1] <= now_us:
            return None
        return item[0]

    def __len__(self) -> int:
        return len(self._tickets)


def _shared(store: object) -> bool:
    return bool(getattr(store, "shared", False))


def check_cluster_stores(tickets: object, replay_store: object, nonce_cache: object) -> None:
    """Refuse a configuration whose server ticket store is shared while its replay store or
    HELLO nonce cache is not (:class:`~iac.errors.ConfigError`).

    A shared ticket store lets another server of the cluster resume a session, and so
    accept 0-RTT early data, that this one issued. Single-use tickets stop a replayed
    early flight at the TLS layer; behind that, the HELLO nonce cache and the message
    replay store are what stop it — and only if every server consults the same ones.
    Each argument is read for a ``shared`` attribute (missing: not shared); a ticket
    store that is not shared imposes nothing.
    """
    if not _shared(tickets):
        return
    missing = [
        name
        for name, store in (("replay store", replay_store), ("HELLO nonce cache", nonce_cache))
        if not _shared(store)
    ]
    if missing:
        raise ConfigError(
            "the server session tickets are shared (other servers can resume this node's "
            f"sessions and accept their 0-RTT data), but the {' and the '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not: a replayed early flight sent to a second "
            "server would run twice. Use a shared (SQLite or Redis) replay store and nonce cache "
            "(iac.stores), or an unshared ticket store."
        )


__all__ = ["DEFAULT_MAX_TICKETS", "MemoryTicketStore", "TicketStore", "check_cluster_stores"]
