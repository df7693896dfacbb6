"""What a node does per frame and per second does not walk every connection it holds.

A relay asks the connection table per FORWARD frame (is the next hop connected, which connection
is it) and the node's housekeeping tells each connection every second whether something waits on
its peer. Both used to build a dict of every open connection, or pass over all of them: at 10,000
peers that was the largest cost of a quiet node. These tests count what is touched.
"""

from __future__ import annotations

from typing import Any

from iac.node.peers import LinkWatch
from iac.transport.base import ConnectionTable, PeerInfo
from iac.wire._pb.iac_pb2 import Hello
from iac.wire.identity import Identity


class Conn:
    """A connection as the table and the watch see it; counts what is read and told."""

    reads = 0

    def __init__(self, peer: str) -> None:
        self.peer = PeerInfo(peer, "quic", "quic://x:1", Hello(), dialed=False)
        self._closed = False
        self.told: list[bool] = []

    @property
    def closed(self) -> bool:
        Conn.reads += 1
        return self._closed

    def close(self) -> None:
        self._closed = True

    def watch(self, waiting: bool) -> None:
        self.told.append(waiting)


def ids(n: int) -> list[str]:
    return [f"{i:064x}" for i in range(1, n + 1)]


def table_of(peers: list[str]) -> tuple[ConnectionTable, dict[str, Conn]]:
    table = ConnectionTable(Identity.generate().agent_id)
    conns = {p: Conn(p) for p in peers}
    for c in conns.values():
        table.add(c)  # type: ignore[arg-type]
    return table, conns


def test_the_open_connections_view_is_live_and_a_lookup_touches_one_connection() -> None:
    peers = ids(1000)
    table, conns = table_of(peers)
    view: Any = table.by_peer()
    Conn.reads = 0
    assert peers[7] in view and view[peers[7]] is conns[peers[7]]
    assert view.get("f" * 64) is None and "f" * 64 not in view
    assert Conn.reads == 2  # the two hits read their own connection's state, nothing else
    conns[peers[7]].close()
    assert peers[7] not in view and view.get(peers[7]) is None  # closed reads as absent
    late = Conn("e" * 64)
    table.add(late)  # type: ignore[arg-type]
    assert view["e" * 64] is late  # the view made before sees it: live, not a copy
    assert len(view) == 1000 and set(view) == (set(peers) - {peers[7]}) | {"e" * 64}


def test_the_link_watch_tells_only_the_connections_whose_answer_changed() -> None:
    peers = ids(1000)
    table, conns = table_of(peers)
    watch = LinkWatch()
    watch.update({peers[1], peers[2]}, table.by_peer())
    assert conns[peers[1]].told == [True] and conns[peers[2]].told == [True]
    Conn.reads = 0
    for _ in range(5):  # ticks with the same peers waited on: nobody is told again
        watch.update({peers[1], peers[2]}, table.by_peer())
    assert conns[peers[1]].told == [True] and Conn.reads <= 10  # two lookups a tick, not 1,000
    watch.update({peers[2]}, table.by_peer())  # peer 1 answered everything
    assert conns[peers[1]].told == [True, False] and conns[peers[2]].told == [True]
    # peer 2 reconnected: its new connection is told, the old one is let go
    conns[peers[2]].close()
    again = Conn(peers[2])
    table.add(again)  # type: ignore[arg-type]
    watch.update({peers[2]}, table.by_peer())
    assert again.told == [True] and len(watch) == 1
    # a waited-on peer whose connection closed is not held on to
    again.close()
    watch.update({peers[2]}, table.by_peer())
    assert len(watch) == 0
    assert all(c.told == [] for p, c in conns.items() if p not in (peers[1], peers[2]))
