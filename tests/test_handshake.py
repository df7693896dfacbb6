"""The HELLO exchange without sockets: two sides wired in memory, explicit time."""

from __future__ import annotations

import pytest

from iac.errors import CloseCode, ConnectionClosed, HandshakeError
from iac.protocol.clock import ManualClock
from iac.protocol.handshake import (
    NONCE_SIZE,
    ClientHandshake,
    HelloDraft,
    HelloOrder,
    NonceCache,
    ServerHandshake,
    channel_binding,
    decode_goaway,
    encode_goaway,
    error_from_close,
)
from iac.wire.identity import Identity
from iac.wire.message import sign_hello

CLIENT = Identity.from_seed(bytes(range(32)))
SERVER = Identity.from_seed(bytes(range(1, 33)))
OTHER = Identity.from_seed(bytes(range(2, 34)))
CERT = channel_binding(b"server certificate DER")
T0 = 1_700_000_000_000_000


def pair(
    order: HelloOrder = HelloOrder.CLIENT_FIRST,
    *,
    expect: str | None = SERVER.agent_id,
    client_binding: bytes | None = None,
    server_binding: bytes | None = None,
    cache: NonceCache | None = None,
    admission=None,
    client_hook=None,
    server_hook=None,
) -> tuple[ClientHandshake, ServerHandshake]:
    default = CERT if order is HelloOrder.CLIENT_FIRST else b""
    c = ClientHandshake(
        CLIENT,
        order,
        binding=default if client_binding is None else client_binding,
        expect=expect,
        hook=client_hook,
    )
    s = ServerHandshake(
        SERVER,
        order,
        binding=default if server_binding is None else server_binding,
        nonce_cache=cache if cache is not None else NonceCache(),
        admission=admission,
        hook=server_hook,
    )
    return c, s


def exchange(c: ClientHandshake, s: ServerHandshake, now: int = T0, server_now: int | None = None) -> None:
    snow = now if server_now is None else server_now
    if c.order is HelloOrder.CLIENT_FIRST:
        hello = c.initial(now)
        assert hello is not None and s.initial(snow) is None
        answer = s.receive(hello, snow)
        assert answer is not None
        assert c.receive(answer, now) is None
    else:
        assert c.initial(now) is None
        first = s.initial(snow)
        assert first is not None
        reply = c.receive(first, now)
        assert reply is not None
        assert s.receive(reply, snow) is None


@pytest.mark.parametrize("order", list(HelloOrder))
def test_success_both_orders(order: HelloOrder) -> None:
    c, s = pair(order)
    exchange(c, s)
    assert c.done and s.done
    assert c.peer_hello is not None and c.peer_hello.agent_id == SERVER.agent_id
    assert s.peer_hello is not None and s.peer_hello.agent_id == CLIENT.agent_id
    assert len(c.nonce) == NONCE_SIZE and c.nonce != s.nonce
    if order is HelloOrder.CLIENT_FIRST:
        assert c.peer_hello.peer_nonce == c.nonce
        assert c.peer_hello.channel_binding == CERT == s.peer_hello.channel_binding
    else:
        assert s.peer_hello.peer_nonce == s.nonce
        assert s.peer_hello.peer_agent_id == SERVER.agent_id


def test_wrong_expected_peer() -> None:
    c, s = pair(expect=OTHER.agent_id)
    with pytest.raises(HandshakeError) as exc_info:  # the server sees it was not the one dialed
        exchange(c, s)
    assert exc_info.value.reason == "wrong_peer"
    c, s = pair(HelloOrder.SERVER_FIRST, expect=OTHER.agent_id)
    with pytest.raises(HandshakeError) as exc_info:  # the client checks the server's HELLO
        exchange(c, s)
    assert exc_info.value.reason == "wrong_peer"


def test_client_checks_expected_peer_itself() -> None:
    c, _s = pair(expect=OTHER.agent_id)
    hello = c.initial(T0)
    assert hello is not None
    s2 = ServerHandshake(SERVER, HelloOrder.CLIENT_FIRST, binding=CERT, nonce_cache=NonceCache())
    # a server that ignores peer_agent_id: the client still refuses
    forged = ClientHandshake(CLIENT, HelloOrder.CLIENT_FIRST, binding=CERT, expect=None)
    answer = s2.receive(forged.initial(T0) or b"", T0)
    c.nonce = forged.nonce
    with pytest.raises(HandshakeError) as exc_info:
        c.receive(answer or b"", T0)
    assert exc_info.value.reason == "wrong_peer"


def test_bad_signature() -> None:
    def corrupt(d: HelloDraft) -> bytes:
        raw = sign_hello(CLIENT, d.hello, d.domain)
        return raw[:-1] + bytes([raw[-1] ^ 1])

    c, s = pair(client_hook=corrupt)
    with pytest.raises(HandshakeError) as exc_info:
        exchange(c, s)
    assert exc_info.value.reason == "hello_bad_signature"


def test_reflected_hello_fails() -> None:
    c, s = pair(server_hook=lambda d: d.peer_hello_bytes)
    with pytest.raises(HandshakeError) as exc_info:
        exchange(c, s)
    assert exc_info.value.reason == "hello_bad_signature"
    c, s = pair(HelloOrder.SERVER_FIRST, client_hook=lambda d: d.peer_hello_bytes)
    with pytest.raises(HandshakeError) as exc_info:
        exchange(c, s)
    assert exc_info.value.reason == "hello_bad_signature"


def test_wrong_domain_fails() -> None:
    def as_server(d: HelloDraft) -> None:
        from iac.wire.identity import Domain

        d.domain = Domain.HELLO_SERVER

    c, s = pair(client_hook=as_server)
    with pytest.raises(HandshakeError) as exc_info:
        exchange(c, s)
    assert exc_info.value.reason == "hello_bad_signature"


@pytest.mark.parametrize("order", list(HelloOrder))
def test_stale(order: HelloOrder) -> None:
    c, s = pair(order)
    with pytest.raises(HandshakeError) as exc_info:
        exchange(c, s, now=T0, server_now=T0 + 61_000_000)
    assert exc_info.value.reason == "stale_hello"
    c, s = pair(order)
    exchange(c, s, now=T0, server_now=T0 + 59_000_000)  # within max_skew


def test_replay_cache() -> None:
    cache = NonceCache(max_skew_us=60_000_000)
    c, s = pair(cache=cache)
    hello = c.initial(T0)
    assert hello is not None
    s.receive(hello, T0)
    s2 = ServerHandshake(SERVER, HelloOrder.CLIENT_FIRST, binding=CERT, nonce_cache=cache)
    with pytest.raises(HandshakeError) as exc_info:
        s2.receive(hello, T0 + 1_000_000)
    assert exc_info.value.reason == "replayed_hello"


def test_nonce_cache_expires_and_is_bounded() -> None:
    clock = ManualClock(T0)
    cache = NonceCache(max_skew_us=1_000_000, max_entries=2)
    cache.check_and_add(b"a" * 16, clock.now_us())
    cache.check_and_add(b"b" * 16, clock.now_us())
    with pytest.raises(HandshakeError):  # full: refuses rather than forget early
        cache.check_and_add(b"c" * 16, clock.now_us())
    with pytest.raises(HandshakeError) as exc_info:
        cache.check_and_add(b"a" * 16, clock.now_us())
    assert exc_info.value.reason == "replayed_hello"
    clock.advance(2.5)
    cache.check_and_add(b"c" * 16, clock.now_us())
    assert len(cache) == 1


def test_server_nonce_not_echoed() -> None:
    c, s = pair(HelloOrder.SERVER_FIRST)
    first = s.initial(T0)
    assert first is not None
    s_other = ServerHandshake(SERVER, HelloOrder.SERVER_FIRST, nonce_cache=NonceCache())
    s_other.initial(T0)
    reply = c.receive(first, T0)
    with pytest.raises(HandshakeError) as exc_info:  # a client HELLO made for another connection
        s_other.receive(reply or b"", T0)
    assert exc_info.value.reason == "replayed_hello"


def test_server_answer_must_echo_client_nonce() -> None:
    c, s = pair()
    hello = c.initial(T0)
    other_client = ClientHandshake(CLIENT, HelloOrder.CLIENT_FIRST, binding=CERT)
    answer = s.receive(other_client.initial(T0) or b"", T0)
    del hello
    with pytest.raises(HandshakeError) as exc_info:
        c.receive(answer or b"", T0)
    assert exc_info.value.reason == "replayed_hello"


def test_channel_binding_mismatch_both_sides() -> None:
    # client saw a relay's certificate; the server refuses
    c, s = pair(client_binding=channel_binding(b"relay"))
    with pytest.raises(HandshakeError) as exc_info:
        exchange(c, s)
    assert exc_info.value.reason == "channel_binding_mismatch"
    # the server answers with a binding that is not what the client saw
    c, _ = pair()
    hello = c.initial(T0)
    s_relay = ServerHandshake(SERVER, HelloOrder.CLIENT_FIRST, binding=CERT, nonce_cache=NonceCache())
    s_relay.binding = CERT  # accepts the client's
    answer = s_relay.receive(hello or b"", T0)
    c.binding = channel_binding(b"relay")
    with pytest.raises(HandshakeError) as exc_info:
        c.receive(answer or b"", T0)
    assert exc_info.value.reason == "channel_binding_mismatch"


def test_admission() -> None:
    c, s = pair(admission=lambda agent: agent != CLIENT.agent_id)
    with pytest.raises(HandshakeError) as exc_info:
        exchange(c, s)
    assert exc_info.value.reason == "admission_denied"
    c, s = pair(admission=lambda agent: agent == CLIENT.agent_id)
    exchange(c, s)


def test_second_hello_refused() -> None:
    c, s = pair()
    exchange(c, s)
    with pytest.raises(HandshakeError) as exc_info:
        s.receive(b"", T0)
    assert exc_info.value.reason == "unexpected_hello"
    with pytest.raises(HandshakeError) as exc_info:
        c.receive(b"", T0)
    assert exc_info.value.reason == "unexpected_hello"


def test_version_and_nonce_size() -> None:
    def v2(d: HelloDraft) -> None:
        d.hello.version = 2

    c, s = pair(client_hook=v2)
    with pytest.raises(HandshakeError, match="version"):
        exchange(c, s)

    def short(d: HelloDraft) -> None:
        d.hello.nonce = b"x" * 8

    c, s = pair(client_hook=short)
    with pytest.raises(HandshakeError, match="nonce"):
        exchange(c, s)


@pytest.mark.parametrize(
    "name",
    [
        "hello_bad_signature",
        "wrong_peer",
        "stale_hello",
        "replayed_hello",
        "channel_binding_mismatch",
        "admission_denied",
    ],
)
def test_close_code_maps_back(name: str) -> None:
    sent = HandshakeError("x", reason=name)
    code, reason = decode_goaway(encode_goaway(sent.close_code, "because"))
    err = error_from_close(code, reason)
    assert type(err) is HandshakeError and err.reason == name and err.close_code == sent.close_code
    assert "because" in str(err)


def test_other_close_codes_are_connection_closed() -> None:
    err = error_from_close(CloseCode.IMPERSONATION, "x")
    assert isinstance(err, ConnectionClosed) and err.code == CloseCode.IMPERSONATION
    assert decode_goaway(b"\xff")[0] == CloseCode.PROTOCOL_ERROR


def test_keys_the_admission_refuses_do_not_fill_the_nonce_cache() -> None:
    """A HELLO's nonce is recorded only once it verified and was admitted: a flood of HELLOs
    from keys the policy refuses leaves the (small) cache empty, and an admitted peer gets in."""
    cache = NonceCache(max_entries=3)

    def admitted(agent: str) -> bool:
        return agent == CLIENT.agent_id

    for _ in range(10):
        stranger = ClientHandshake(Identity.generate(), HelloOrder.CLIENT_FIRST, binding=CERT)
        s = ServerHandshake(
            SERVER, HelloOrder.CLIENT_FIRST, binding=CERT, nonce_cache=cache, admission=admitted
        )
        with pytest.raises(HandshakeError) as exc_info:
            s.receive(stranger.initial(T0) or b"", T0)
        assert exc_info.value.reason == "admission_denied"
    assert len(cache) == 0
    c, s = pair(cache=cache, admission=admitted)
    exchange(c, s)
    assert c.nonce in cache


def test_a_nonce_is_kept_for_twice_the_larger_skew() -> None:
    cache = NonceCache(max_skew_us=1_000_000)
    cache.check_and_add(b"a" * 16, T0, max_skew_us=5_000_000)  # the handshake's skew is larger
    cache.expire(T0 + 9_999_999)
    with pytest.raises(HandshakeError) as exc_info:
        cache.check_and_add(b"a" * 16, T0 + 9_999_999)
    assert exc_info.value.reason == "replayed_hello"
    cache.check_and_add(b"a" * 16, T0 + 10_000_001)  # expired, then recorded again


def test_check_cluster_stores_refuses_shared_tickets_without_shared_replay_and_nonces() -> None:
    class Shared:
        shared = True

    from iac.errors import ConfigError
    from iac.protocol.tickets import MemoryTicketStore, check_cluster_stores

    check_cluster_stores(MemoryTicketStore(), object(), NonceCache())  # nothing shared: fine
    check_cluster_stores(Shared(), Shared(), Shared())
    with pytest.raises(ConfigError, match="replay store and the HELLO nonce cache are not"):
        check_cluster_stores(Shared(), object(), NonceCache())
    with pytest.raises(ConfigError, match="HELLO nonce cache is not"):
        check_cluster_stores(Shared(), Shared(), NonceCache())
    with pytest.raises(ConfigError, match="replay store is not"):
        check_cluster_stores(Shared(), object(), Shared())


def test_memory_ticket_store_takes_each_ticket_once() -> None:
    from iac.protocol.tickets import MemoryTicketStore

    store = MemoryTicketStore(max_entries=2)
    store.put(b"a", b"A", T0 + 10, T0)
    store.put(b"b", b"B", T0 + 10, T0)
    store.put(b"c", b"C", T0 + 10, T0)  # beyond max_entries: the oldest goes
    assert store.take(b"a", T0) is None
    assert store.take(b"b", T0) == b"B" and store.take(b"b", T0) is None
    assert store.take(b"c", T0 + 10) is None  # expired
