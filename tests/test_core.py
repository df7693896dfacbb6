"""The sans-IO connection core, driven with an explicit ``now`` (no sockets, no clock): its
transition table, the close error (first cause wins, set nowhere else), the backlog judge
and the idle and keep-alive timers. The adapters over real sockets are tested in
test_streams.py, test_quic.py and the conformance suite."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from iac.errors import CloseCode, ConnectionClosed, HandshakeError, LocalError, ProtocolError
from iac.transport.budget import MemoryBudget, RecvBudget
from iac.transport.core import (
    IDLE_REASON,
    TRANSITIONS,
    ConnectionCore,
    Event,
    Judged,
    State,
    TimerEvent,
    closed_by_this_side,
)
from iac.transport.queues import Inbox
from iac.transport.session import SessionLogic, goaway_frame
from iac.wire.dicts import DictionarySet
from iac.wire.frames import FrameDecoder, FrameType, PackedFrame, encode_frame

ROOT = Path(__file__).resolve().parent.parent


def core(*, idle: float | None = 30.0, keepalive: float | None = None) -> ConnectionCore:
    return ConnectionCore(now=0.0, idle_timeout=idle, linger=1.0, keepalive=keepalive)


def frames(*encoded: bytes) -> list[PackedFrame]:
    return FrameDecoder().feed_packed(b"".join(encoded))


def message(n: int = 0) -> bytes:
    return encode_frame(FrameType.MESSAGE, b"m%d" % n)


def inbox(max_frames: int = 1024) -> tuple[Inbox, list[ProtocolError]]:
    faults: list[ProtocolError] = []
    box = Inbox(
        max_frames=max_frames,
        budget=RecvBudget(1 << 20, MemoryBudget(1 << 24)),
        dictionaries=DictionarySet(),
        batch_bytes=1 << 20,
        on_room=lambda: None,
        on_fault=faults.append,
    )
    return box, faults


# -- states ---------------------------------------------------------------------------------------


def test_the_table_is_one_way_and_closed_is_final() -> None:
    # a close and the transport's end are legal in every state; a HELLO verifies once; only an
    # open connection is probed (and stays open)
    legal = {(s, e) for s in State for e in (Event.CLOSE, Event.TERMINATED)}
    assert set(TRANSITIONS) == legal | {(State.HANDSHAKING, Event.VERIFIED), (State.OPEN, Event.PROBE)}
    assert TRANSITIONS[(State.OPEN, Event.PROBE)] is State.OPEN
    assert TRANSITIONS[(State.HANDSHAKING, Event.VERIFIED)] is State.OPEN
    assert {TRANSITIONS[(State.CLOSED, e)] for e in (Event.CLOSE, Event.TERMINATED)} == {State.CLOSED}
    assert {TRANSITIONS[(State.CLOSING, e)] for e in (Event.CLOSE, Event.TERMINATED)} == {
        State.CLOSING,
        State.CLOSED,
    }


def test_a_second_open_is_a_bug_of_the_adapter() -> None:
    c = core()
    c.open(SessionLogic("peer"))
    with pytest.raises(LocalError) as err:
        c.open(SessionLogic("peer"))
    assert err.value.reason == "invalid_transition"


def test_a_connection_opens_closes_and_ends_in_order() -> None:
    c = core()
    assert c.state is State.HANDSHAKING and not c.closed and c.error is None
    assert c.open(SessionLogic("peer"))
    assert c.state is State.OPEN and not c.closed
    mine = closed_by_this_side(CloseCode.NO_ERROR, "done")
    assert c.close(mine)
    assert c.state is State.CLOSING and c.closed and c.error is mine and not c.ended
    assert c.terminated()
    assert c.state is State.CLOSED and c.ended and c.error is mine
    assert not c.terminated()  # once


def test_the_first_cause_wins() -> None:
    c = core()
    c.open(SessionLogic("peer"))
    first = ConnectionClosed("peer closed the connection", 0, "")
    assert c.close(first)
    assert not c.close(closed_by_this_side(CloseCode.GOING_AWAY, "late"))  # closing already
    c.terminated(ConnectionClosed("QUIC transport error"))
    assert c.error is first


def test_a_connection_that_ends_unclosed_gets_the_given_error_or_a_plain_one() -> None:
    c = core()
    c.terminated()
    assert isinstance(c.error, ConnectionClosed) and str(c.error) == "connection closed"
    d = core()
    lost = ConnectionClosed("connection lost: reset")
    d.terminated(lost)
    assert d.error is lost and d.state is State.CLOSED


def test_a_handshake_that_fails_never_opens() -> None:
    c = core()
    c.close(HandshakeError("refused", reason="unexpected_hello"))
    assert not c.open(SessionLogic("peer"))  # the HELLO verified too late: it stays closing
    assert c.state is State.CLOSING


def test_the_close_text_names_the_reason() -> None:
    assert str(closed_by_this_side(CloseCode.NO_ERROR, "")) == "connection closed by this side"
    err = closed_by_this_side(CloseCode.GOING_AWAY, "bye")
    assert str(err) == "connection closed by this side: bye" and err.code == CloseCode.GOING_AWAY


# -- timers ---------------------------------------------------------------------------------------


def test_idle_deadline_moves_with_activity_then_closes_with_idle_timeout() -> None:
    c = core(idle=30.0)
    c.open(SessionLogic("peer"))
    assert c.next_timer() == 30.0
    c.last_activity = 10.0
    assert c.handle_timer(30.0) is TimerEvent.NONE and c.next_timer() == 40.0
    assert c.handle_timer(40.0) is TimerEvent.IDLE
    assert c.state is State.CLOSING and c.next_timer() is None
    assert isinstance(c.error, ConnectionClosed)
    assert (c.error.code, c.error.peer_reason, str(c.error)) == (
        CloseCode.IDLE_TIMEOUT,
        IDLE_REASON,
        "connection idle for 30 s",
    )
    assert c.handle_timer(100.0) is TimerEvent.NONE  # closing: no second close


def test_keepalive_pings_until_idle_wins() -> None:
    c = core(idle=25.0, keepalive=10.0)
    assert c.next_timer() == 25.0  # no probe before the transport is up
    c.start_keepalive(0.0)
    assert c.next_timer() == 10.0
    assert c.handle_timer(10.0) is TimerEvent.PING and c.next_timer() == 20.0
    assert c.handle_timer(20.0) is TimerEvent.PING and c.next_timer() == 25.0
    assert c.handle_timer(25.0) is TimerEvent.IDLE


def test_no_idle_timeout_and_no_keepalive_means_no_timer() -> None:
    c = core(idle=None)
    assert c.next_timer() is None


def test_a_close_flushes_only_an_open_connection_nothing_else_closed() -> None:
    c = core()
    assert not c.flushes_on_close(verified=False)
    c.open(SessionLogic("peer"))
    assert c.flushes_on_close(verified=True)
    assert c.linger_until(5.0) == 6.0
    c.close(ConnectionClosed("peer closed the connection"))
    assert not c.flushes_on_close(verified=True)


# -- the backlog judge ----------------------------------------------------------------------------


def test_judge_queues_in_order_within_the_limit() -> None:
    c = core()
    c.open(SessionLogic("peer"))
    box, _ = inbox()
    box.arrived(frames(*(message(i) for i in range(5))))
    assert c.judge(box, 2) is Judged.MORE and len(box) == 2 and len(box.backlog) == 3
    assert c.judge(box) is Judged.DONE and len(box) == 5 and not box.backlog


def test_judge_stops_when_the_queue_is_full() -> None:
    c = core()
    c.open(SessionLogic("peer"))
    box, _ = inbox(max_frames=2)
    box.arrived(frames(*(message(i) for i in range(3))))
    assert c.judge(box) is Judged.BLOCKED and len(box) == 2 and len(box.backlog) == 1


def test_the_peers_goaway_closes_and_what_follows_is_not_queued() -> None:
    c = core()
    c.open(SessionLogic("peer"))
    box, _ = inbox()
    box.arrived(frames(message(1), goaway_frame(int(CloseCode.GOING_AWAY), "restart"), message(2)))
    assert c.judge(box) is Judged.GOAWAY
    assert c.state is State.CLOSING and len(box) == 1
    assert isinstance(c.error, ConnectionClosed) and c.error.code == CloseCode.GOING_AWAY
    assert c.judge(box) is Judged.CLOSED


def test_a_frame_the_session_refuses_raises_its_protocol_error() -> None:
    c = core()
    c.open(SessionLogic("peer"))
    box, _ = inbox()
    box.arrived(frames(encode_frame(FrameType.HELLO, b"")))
    with pytest.raises(HandshakeError) as exc_info:
        c.judge(box)
    assert exc_info.value.reason == "unexpected_hello"


def test_nothing_is_judged_before_the_hello_verified() -> None:
    c = core()
    box, _ = inbox()
    box.arrived(frames(message()))
    assert c.judge(box) is Judged.DONE and len(box) == 0 and len(box.backlog) == 1


# -- only the core sets the close error -----------------------------------------------------------

#: Modules that keep an error of their own, and why it is not the close error.
OWN_ERRORS = {
    "iac/transport/queues.py": "the send and receive queues keep the close error the adapter "
    "hands them (close/finish/fail), to raise it to a waiting send() or recv()",
}


def assignments_to_errors(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, target)`` for each assignment to an attribute ``_error`` / ``close_error``."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            targets = [node.target]
        else:
            continue
        for target in targets:
            for sub in ast.walk(target):
                if isinstance(sub, ast.Attribute) and sub.attr in ("_error", "close_error"):
                    out.append((node.lineno, ast.unparse(sub)))
    return out


def test_only_the_core_assigns_the_close_error() -> None:
    bad = []
    core_sites = []
    for path in sorted((ROOT / "iac").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in OWN_ERRORS:
            continue
        found = assignments_to_errors(ast.parse(path.read_text(encoding="utf-8")))
        if rel == "iac/transport/core.py":
            core_sites = found
        else:
            bad += [f"{rel}:{line}: {target}" for line, target in found]
    assert not bad, "the close error is assigned outside the core:\n" + "\n".join(bad)
    assert [t for _, t in core_sites] == ["self._error"] * 3  # __init__, close(), terminated()


def test_the_check_sees_every_kind_of_assignment() -> None:
    source = (
        "conn._error = e\nself._error: E = None\nx.close_error = e\na, self._error = 1, 2\nself.error = 1\n"
    )
    assert [t for _, t in assignments_to_errors(ast.parse(source))] == [
        "conn._error",
        "self._error",
        "x.close_error",
        "self._error",
    ]
