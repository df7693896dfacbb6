"""TLS session tickets for QUIC resumption and 0-RTT.

Client side, :class:`ClientTicketStore` keeps at most one ticket per server
address, together with the SHA-256 of the certificate the server showed when
the ticket was issued (on a resumed session no certificate is sent, so the
HELLO's channel binding comes from here) and the server's AgentId. A ticket is
taken out when it is used (:meth:`ClientTicketStore.pop`): a ticket is never
presented twice by this side. The store can persist to a JSON file (mode 0600).

Server side, :class:`ServerTicketStore` hands the QUIC library a fetcher whose lookup
*removes* the ticket, so that each ticket resumes at most one session and a
replayed 0-RTT flight finds nothing to resume. ``reuse=True`` keeps tickets
(aioquic's default behaviour); it exists for tests that show IAC's own replay
defences without the ticket's help.

Tickets are the QUIC library's ``SessionTicket`` (aioquic and qh3 have the same
fields); one read back from the file is built with the selected backend's class.
"""

from __future__ import annotations

import datetime
import json
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from iac.errors import ConfigError
from iac.transport.quic.backend import SessionTicketLike, get_backend

SessionTicket = SessionTicketLike


@dataclass(frozen=True)
class StoredTicket:
    """A client's ticket and what it knew about the server when it got it."""

    ticket: SessionTicket
    cert_sha256: bytes
    agent_id: str


def _ticket_to_json(t: SessionTicket) -> dict[str, Any]:
    return {
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
    lib = get_backend()
    return lib.SessionTicket(
        age_add=int(d["age_add"]),
        cipher_suite=lib.CipherSuite(int(d["cipher_suite"])),
        not_valid_after=datetime.datetime.fromisoformat(d["not_valid_after"]),
        not_valid_before=datetime.datetime.fromisoformat(d["not_valid_before"]),
        resumption_secret=bytes.fromhex(d["resumption_secret"]),
        server_name=str(d["server_name"]),
        ticket=bytes.fromhex(d["ticket"]),
        max_early_data_size=d["max_early_data_size"],
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
        if self.path is not None and self.path.exists():
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
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.replace(tmp, self.path)

    def _load(self) -> None:
        if self.path is None:
            return
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            for key, item in data.items():
                self._tickets[key] = StoredTicket(
                    _ticket_from_json(item["ticket"]), bytes.fromhex(item["cert_sha256"]), item["agent_id"]
                )
        except (OSError, ValueError, KeyError, TypeError):
            # A damaged ticket file only costs a full handshake.
            self._tickets.clear()


class ServerTicketStore:
    """Tickets a server issued. A lookup removes the ticket unless ``reuse`` is set (tests only)."""

    def __init__(self, *, reuse: bool = False, max_entries: int = 65536) -> None:
        if max_entries < 1:
            raise ConfigError("max_entries must be positive")
        self.reuse = reuse
        self.max_entries = max_entries
        self._tickets: OrderedDict[bytes, SessionTicket] = OrderedDict()
        self.issued = 0
        self.resumed = 0
        self.refused = 0

    def add(self, ticket: SessionTicket) -> None:
        self._tickets[ticket.ticket] = ticket
        self.issued += 1
        while len(self._tickets) > self.max_entries:
            self._tickets.popitem(last=False)

    def fetch(self, label: bytes) -> SessionTicket | None:
        ticket = self._tickets.get(label) if self.reuse else self._tickets.pop(label, None)
        if ticket is None:
            self.refused += 1
        else:
            self.resumed += 1
        return ticket

    def __len__(self) -> int:
        return len(self._tickets)


__all__ = ["ClientTicketStore", "ServerTicketStore", "StoredTicket"]
