"""TLS session tickets for QUIC resumption and 0-RTT.

Client side, :class:`ClientTicketStore` keeps at most one ticket per server
address, together with the SHA-256 of the certificate the server showed when
the ticket was issued (on a resumed session no certificate is sent, so the
HELLO's channel binding comes from here) and the server's AgentId. A ticket is
taken out when it is used (:meth:`ClientTicketStore.pop`): a ticket is never
presented twice by this side. The store can persist to a JSON file (mode 0600, written
through a fresh temporary file and a rename; a file that is damaged, not private or not this
user's is not used).

Server side, :class:`ServerTicketStore` hands the QUIC library a fetcher whose lookup
*removes* the ticket, so that each ticket resumes at most one session and a
replayed 0-RTT flight finds nothing to resume. ``reuse=True`` keeps tickets
(aioquic's default behaviour); it exists for tests that show IAC's own replay
defences without the ticket's help. The tickets live in a
:class:`~iac.protocol.tickets.TicketStore` as bytes: in memory by default, or in a
store that several servers with one identity share (:mod:`iac.stores.tickets`),
taken atomically so that a ticket resumes one session in the whole cluster. In CA
mode a ticket also carries the client certificate chain its session verified, and
a resumption is refused when that chain no longer verifies.

Tickets are the QUIC library's ``SessionTicket`` (aioquic and qh3 have the same
fields); one read back from the file is built with the selected backend's class.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from iac.errors import ConfigError, StoreUnavailable
from iac.protocol.tickets import DEFAULT_MAX_TICKETS, MemoryTicketStore, TicketStore
from iac.transport.quic.backend import SessionTicketLike, get_backend
from iac.wire.private import read_private, write_private

log = logging.getLogger("iac.transport.quic")

SessionTicket = SessionTicketLike

#: The largest session ticket file read back, in bytes (a ticket is about 1 KiB in JSON).
MAX_TICKETS_FILE = 16 * 1024 * 1024


@dataclass(frozen=True)
class StoredTicket:
    """A client's ticket and what it knew about the server when it got it."""

    ticket: SessionTicket
    cert_sha256: bytes
    agent_id: str


def _ticket_to_json(t: SessionTicket) -> dict[str, Any]:
    return {
        # the QUIC library whose TLS made the ticket (its class, and its datetimes, are that
        # library's: a qh3 listener must get a qh3 ticket back, whatever backend is selected)
        "lib": type(t).__module__.partition(".")[0],
        "age_add": t.age_add,
        "cipher_suite": int(t.cipher_suite),
        "not_valid_after": t.not_valid_after.isoformat(),
        "not_valid_before": t.not_valid_before.isoformat(),
        "resumption_secret": t.resumption_secret.hex(),
        "server_name": t.server_name,
        "ticket": t.ticket.hex(),
        "max_early_data_size": t.max_early_data_size,
        "other_extensions": [[k, v.hex()] for k, v in t.other_extensions],
    }


def _ticket_from_json(d: dict[str, Any]) -> SessionTicket:
    try:
        lib = get_backend(d.get("lib"))
    except ConfigError as exc:  # a library that is not installed here: as a damaged entry
        raise ValueError(str(exc)) from None
    server_name = d["server_name"]
    return lib.SessionTicket(
        age_add=int(d["age_add"]),
        cipher_suite=lib.CipherSuite(int(d["cipher_suite"])),
        not_valid_after=datetime.datetime.fromisoformat(d["not_valid_after"]),
        not_valid_before=datetime.datetime.fromisoformat(d["not_valid_before"]),
        resumption_secret=bytes.fromhex(d["resumption_secret"]),
        server_name=None if server_name is None else str(server_name),
        ticket=bytes.fromhex(d["ticket"]),
        max_early_data_size=None if d["max_early_data_size"] is None else int(d["max_early_data_size"]),
        other_extensions=[(int(k), bytes.fromhex(v)) for k, v in d["other_extensions"]],
    )


class ClientTicketStore:
    """Session tickets a client received, one per server address, used once each."""

    def __init__(self, path: str | os.PathLike[str] | None = None, *, max_entries: int = 1024) -> None:
        if max_entries < 1:
            raise ConfigError("max_entries must be positive")
        self.path = Path(path) if path is not None else None
        self.max_entries = max_entries
        self._tickets: OrderedDict[str, StoredTicket] = OrderedDict()
        if self.path is not None:
            self._load()

    def put(self, key: str, ticket: SessionTicket, cert_sha256: bytes, agent_id: str) -> None:
        self._tickets.pop(key, None)
        self._tickets[key] = StoredTicket(ticket, cert_sha256, agent_id)
        while len(self._tickets) > self.max_entries:
            self._tickets.popitem(last=False)
        self._save()

    def pop(self, key: str) -> StoredTicket | None:
        """Take the ticket for ``key`` out of the store (a ticket is presented once)."""
        stored = self._tickets.pop(key, None)
        if stored is not None:
            self._save()
            if not stored.ticket.is_valid:
                return None
        return stored

    def __contains__(self, key: str) -> bool:
        return key in self._tickets

    def __len__(self) -> int:
        return len(self._tickets)

    def _save(self) -> None:
        if self.path is None:
            return
        data = {
            key: {
                "ticket": _ticket_to_json(s.ticket),
                "cert_sha256": s.cert_sha256.hex(),
                "agent_id": s.agent_id,
            }
            for key, s in self._tickets.items()
        }
        try:
            write_private(self.path, json.dumps(data).encode())
        except OSError as exc:  # the tickets stay in memory; the next save tries again
            log.warning("session tickets not saved to %s: %s", self.path, exc.strerror or exc)

    def _load(self) -> None:
        """Read the tickets back; a file that is damaged, not private or not this user's is not
        used (one WARNING line; the dials it would have resumed do a full handshake)."""
        if self.path is None:
            return
        try:
            raw = read_private(self.path, MAX_TICKETS_FILE)
            data = json.loads(raw.decode("utf-8"))
            if not isinstance(data, dict):
                raise ValueError(f"a JSON {type(data).__name__}, not an object")
            tickets: OrderedDict[str, StoredTicket] = OrderedDict()
            for key, item in list(data.items())[-self.max_entries :]:
                if not isinstance(key, str) or not isinstance(item, dict):
                    raise ValueError("an entry is not an object")
                agent_id = item["agent_id"]
                if not isinstance(agent_id, str) or not isinstance(item["ticket"], dict):
                    raise ValueError("an entry has the wrong types")
                tickets[key] = StoredTicket(
                    _ticket_from_json(item["ticket"]), bytes.fromhex(item["cert_sha256"]), agent_id
                )
        except FileNotFoundError:
            return
        except ConfigError as exc:
            log.warning("session tickets not used: %s", exc)
            return
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
            if isinstance(exc, ValueError) and not isinstance(exc, UnicodeDecodeError):
                why = str(exc)[:120] or why
            log.warning(
                "session tickets not used: %s: damaged (%s); dials do a full handshake", self.path, why
            )
            return
        self._tickets = tickets


@dataclass(frozen=True)
class IssuedTicket:
    """A ticket a server issued, and the client certificate chain (DER, leaf first) its
    session verified in CA mode (empty otherwise)."""

    ticket: SessionTicket
    client_chain: tuple[bytes, ...] = ()


def _now_us() -> int:
    return time.time_ns() // 1000


def _to_us(when: datetime.datetime) -> int:
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return int(when.timestamp() * 1_000_000)


class ServerTicketStore:
    """Tickets a server issued, kept in a :class:`~iac.protocol.tickets.TicketStore`
    (default: in memory). A lookup removes the ticket unless ``reuse`` is set (tests only).

    ``shared`` is the store's: True when other processes or hosts take the same tickets.
    The store is called on the event loop (the QUIC library asks for a ticket in the
    middle of a handshake), so a shared one should answer fast; when it fails, a lookup
    finds nothing (a full handshake follows) and a new ticket is not kept.
    """

    def __init__(
        self,
        store: TicketStore | None = None,
        *,
        reuse: bool = False,
        max_entries: int = DEFAULT_MAX_TICKETS,
        clock: Callable[[], int] = _now_us,
    ) -> None:
        if max_entries < 1:
            raise ConfigError("max_entries must be positive")
        self.store: TicketStore = store if store is not None else MemoryTicketStore(max_entries)
        self.reuse = reuse
        self.clock = clock
        self.issued = 0
        self.resumed = 0
        self.refused = 0
        self.failed = 0  # store calls that failed (StoreUnavailable)

    @property
    def shared(self) -> bool:
        return bool(self.store.shared)

    def add(self, ticket: SessionTicket, client_chain: Sequence[bytes] = ()) -> None:
        """Keep a ticket the library issued (with the client chain its session verified)."""
        blob = json.dumps(
            {"ticket": _ticket_to_json(ticket), "client_chain": [c.hex() for c in client_chain]},
            separators=(",", ":"),
        ).encode()
        try:
            self.store.put(bytes(ticket.ticket), blob, _to_us(ticket.not_valid_after), self.clock())
        except StoreUnavailable as exc:
            self.failed += 1
            log.warning("session ticket not kept: %s", exc)
            return
        self.issued += 1

    def take(self, label: bytes) -> IssuedTicket | None:
        """The ticket ``label`` names, taken out of the store (put back with ``reuse``)."""
        now = self.clock()
        try:
            blob = self.store.take(label, now)
            if blob is not None and self.reuse:
                item = json.loads(blob)
                self.store.put(label, blob, _to_us(_ticket_from_json(item["ticket"]).not_valid_after), now)
        except StoreUnavailable as exc:
            self.failed += 1
            log.warning("session ticket lookup failed (full handshake instead): %s", exc)
            blob = None
        issued = None
        if blob is not None:
            try:
                item = json.loads(blob)
                issued = IssuedTicket(
                    _ticket_from_json(item["ticket"]), tuple(bytes.fromhex(c) for c in item["client_chain"])
                )
            except (ValueError, KeyError, TypeError):  # a damaged entry only costs a full handshake
                issued = None
        if issued is None:
            self.refused += 1
        else:
            self.resumed += 1
        return issued

    def fetch(self, label: bytes) -> SessionTicket | None:
        """The library's ticket fetcher: :meth:`take` without the client chain."""
        issued = self.take(label)
        return None if issued is None else issued.ticket

    def __len__(self) -> int:
        size = getattr(self.store, "__len__", None)
        return int(size()) if size is not None else 0


__all__ = ["ClientTicketStore", "IssuedTicket", "ServerTicketStore", "StoredTicket"]
