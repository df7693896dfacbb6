"""The HELLO exchange, sans-IO: bytes and time in, bytes and errors out.

The rules are in docs/PROTOCOL.md, "Sessions and the handshake".

Two orders exist:

* :attr:`HelloOrder.CLIENT_FIRST` (QUIC, TLS/TCP): the client sends HELLO, the
  server checks it and answers with its own HELLO, which echoes the client's
  nonce in ``peer_nonce``. Both HELLOs carry ``channel_binding`` = SHA-256 of
  the server's certificate (DER) as the sender saw it; each side refuses a
  binding that is not this connection's certificate.
* :attr:`HelloOrder.SERVER_FIRST` (UNIX sockets, no certificate): the server
  sends HELLO first; the client's HELLO echoes the server's nonce in
  ``peer_nonce`` (freshness instead of a binding) and names the server in
  ``peer_agent_id``. ``channel_binding`` is empty.

HELLOs are signed by role (``iac-hello-client-v1`` / ``iac-hello-server-v1``), so a
HELLO reflected back at its sender fails its signature check. Every check raises
a :class:`~iac.errors.HandshakeError` (its ``reason`` says which check) whose ``close_code`` is what the
refusing side sends in GOAWAY; :func:`error_from_close` turns that code back into
the same class on the other side.

Tests forge HELLOs through :class:`HelloDraft` and a ``hook`` (see
:class:`ClientHandshake`), so that no production code path needs to be bent.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum

from iac.errors import (
    REASONS,
    CloseCode,
    ConfigError,
    ConnectionClosed,
    HandshakeError,
    IacError,
    MessageRejected,
)
from iac.protocol.nonces import DEFAULT_MAX_SKEW_US, DEFAULT_NONCE_CACHE_SIZE, NonceCache, NonceStore
from iac.wire._pb.iac_pb2 import GoAway, Hello
from iac.wire.frames import DEFAULT_MAX_FRAME_SIZE
from iac.wire.identity import Domain, Identity
from iac.wire.message import open_hello, sign_hello

PROTOCOL_VERSION = 1
NONCE_SIZE = 16
ALPN = "iac/1"
#: Longest GOAWAY reason sent (characters).
MAX_REASON = 200


class HelloOrder(Enum):
    CLIENT_FIRST = "client_first"  # QUIC, TLS/TCP: binding to the server certificate
    SERVER_FIRST = "server_first"  # UNIX: server nonce echoed by the client


class Role(Enum):
    CLIENT = "client"
    SERVER = "server"

    @property
    def domain(self) -> Domain:
        return Domain.HELLO_CLIENT if self is Role.CLIENT else Domain.HELLO_SERVER

    @property
    def other(self) -> Role:
        return Role.SERVER if self is Role.CLIENT else Role.CLIENT


def channel_binding(cert_der: bytes) -> bytes:
    """RFC 5929 tls-server-end-point for IAC: SHA-256 of the server certificate (DER)."""
    return hashlib.sha256(cert_der).digest()


#: The HELLO capability that names the sender's process (docs/PROTOCOL.md, "Duplicate
#: connections"): ``instance/<16 hex digits>``, random per process. A connection whose
#: signed HELLO names another instance than the old connection of the same key comes from
#: a restarted (or a second) process.
INSTANCE_CAPABILITY = "instance"
_instance: tuple[int, str] = (0, "")


def process_instance() -> str:
    """This process's instance id (a fork gets its own)."""
    global _instance
    pid = os.getpid()
    if _instance[0] != pid:
        _instance = (pid, secrets.token_hex(8))
    return _instance[1]


def instance_of(hello: Hello) -> str:
    """The instance id a HELLO names ("" for a peer that names none)."""
    prefix = INSTANCE_CAPABILITY + "/"
    for cap in hello.capabilities:
        if cap.startswith(prefix):
            return cap[len(prefix) :][:64]
    return ""


@dataclass(frozen=True)
class HelloParams:
    """What a side announces about itself in its HELLO."""

    session_id: int = 0
    dict_ids: tuple[int, ...] = ()
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    listen_addrs: tuple[str, ...] = ()
    capabilities: tuple[str, ...] = ()


@dataclass
class HelloDraft:
    """A HELLO about to be signed. A test hook may change any field, or replace the bytes."""

    role: Role
    hello: Hello
    domain: Domain
    peer_hello_bytes: bytes | None = None  # the peer's signed HELLO, when this side answers one


#: Test hook: called with the draft before signing. Return None to sign the
#: (possibly changed) draft, or the exact bytes to send instead.
HelloHook = Callable[[HelloDraft], bytes | None]


def build_hello(
    identity: Identity,
    *,
    now_us: int,
    nonce: bytes,
    params: HelloParams,
    peer_nonce: bytes = b"",
    peer_agent_id: str = "",
    binding: bytes = b"",
    version: int = PROTOCOL_VERSION,
) -> Hello:
    """An unsigned HELLO with every field set."""
    return Hello(
        version=version,
        agent_id=identity.agent_id,
        session_id=params.session_id,
        timestamp=now_us,
        nonce=nonce,
        peer_nonce=peer_nonce,
        dict_ids=params.dict_ids,
        max_frame_size=params.max_frame_size,
        listen_addrs=params.listen_addrs,
        capabilities=(*params.capabilities, f"{INSTANCE_CAPABILITY}/{process_instance()}"),
        channel_binding=binding,
        peer_agent_id=peer_agent_id,
    )


def _finish(identity: Identity, draft: HelloDraft, hook: HelloHook | None) -> bytes:
    if hook is not None:
        raw = hook(draft)
        if raw is not None:
            return raw
    return sign_hello(identity, draft.hello, draft.domain)


def _open(data: bytes, role_of_sender: Role) -> Hello:
    try:
        return open_hello(data, role_of_sender.domain)
    except MessageRejected as exc:  # bad_signature, invalid_agent_id
        raise HandshakeError(f"{role_of_sender.value} HELLO: {exc}", reason="hello_bad_signature") from None


def _check_common(hello: Hello, *, now_us: int, max_skew_us: int, binding: bytes, sender: Role) -> None:
    if hello.version != PROTOCOL_VERSION:
        raise HandshakeError(f"unsupported protocol version {hello.version} (this side speaks 1)")
    skew = hello.timestamp - now_us
    if abs(skew) > max_skew_us:
        raise HandshakeError(
            f"{sender.value} HELLO timestamp is {skew / 1e6:+.1f} s from this side's clock "
            f"(max {max_skew_us / 1e6:.0f} s)",
            reason="stale_hello",
        )
    if len(hello.nonce) != NONCE_SIZE:
        raise HandshakeError(f"HELLO nonce is {len(hello.nonce)} bytes, not {NONCE_SIZE}")
    if not secrets.compare_digest(hello.channel_binding, binding):
        raise HandshakeError(
            f"{sender.value} HELLO is bound to another certificate than this connection's "
            "(a relay in the middle?)",
            reason="channel_binding_mismatch",
        )
    if hello.max_frame_size and hello.max_frame_size < 1024:
        raise HandshakeError(f"HELLO announces max_frame_size {hello.max_frame_size}, below 1024")


@dataclass
class _Base:
    identity: Identity
    order: HelloOrder
    params: HelloParams = field(default_factory=HelloParams)
    binding: bytes = b""
    max_skew_us: int = DEFAULT_MAX_SKEW_US
    nonce: bytes = b""
    hook: HelloHook | None = None
    peer_hello: Hello | None = None
    sent_bytes: bytes | None = None

    def __post_init__(self) -> None:
        if not self.nonce:
            self.nonce = secrets.token_bytes(NONCE_SIZE)
        if self.order is HelloOrder.SERVER_FIRST and self.binding:
            raise ConfigError("a SERVER_FIRST (UNIX) handshake has no certificate binding")

    @property
    def done(self) -> bool:
        return self.peer_hello is not None and self.sent_bytes is not None

    def _open_checked(self, data: bytes, now_us: int, sender: Role) -> Hello:
        """The peer's HELLO, once: signature in ``sender``'s domain and the checks both sides share."""
        if self.peer_hello is not None:
            raise HandshakeError("a second HELLO on this connection", reason="unexpected_hello")
        hello = _open(data, sender)
        _check_common(hello, now_us=now_us, max_skew_us=self.max_skew_us, binding=self.binding, sender=sender)
        return hello


@dataclass
class ClientHandshake(_Base):
    """The dialing side. ``expect``: the AgentId that was dialed (None: accept any).

    CLIENT_FIRST: ``initial()`` gives the HELLO to send; ``receive()`` checks the
    server's answer and returns None. SERVER_FIRST: ``initial()`` gives None;
    ``receive()`` checks the server's HELLO and returns the client's HELLO.
    """

    expect: str | None = None

    def initial(self, now_us: int) -> bytes | None:
        if self.order is HelloOrder.SERVER_FIRST:
            return None
        return self._make(now_us, peer_nonce=b"", peer_agent_id=self.expect or "", peer_bytes=None)

    def _make(self, now_us: int, *, peer_nonce: bytes, peer_agent_id: str, peer_bytes: bytes | None) -> bytes:
        hello = build_hello(
            self.identity,
            now_us=now_us,
            nonce=self.nonce,
            params=self.params,
            peer_nonce=peer_nonce,
            peer_agent_id=peer_agent_id,
            binding=self.binding,
        )
        draft = HelloDraft(Role.CLIENT, hello, Domain.HELLO_CLIENT, peer_bytes)
        self.sent_bytes = _finish(self.identity, draft, self.hook)
        return self.sent_bytes

    def receive(self, data: bytes, now_us: int) -> bytes | None:
        hello = self._open_checked(data, now_us, Role.SERVER)
        if self.expect is not None and hello.agent_id != self.expect:
            raise HandshakeError(
                f"dialed {self.expect[:16]}…, but the peer is {hello.agent_id[:16]}…", reason="wrong_peer"
            )
        if self.order is HelloOrder.CLIENT_FIRST:
            if not secrets.compare_digest(hello.peer_nonce, self.nonce):
                raise HandshakeError(
                    "server HELLO does not echo this connection's client nonce", reason="replayed_hello"
                )
            if hello.peer_agent_id != self.identity.agent_id:
                raise HandshakeError(
                    "server HELLO names another client in peer_agent_id", reason="wrong_peer"
                )
            self.peer_hello = hello
            return None
        if hello.peer_nonce:
            raise HandshakeError("a server HELLO that goes first carries no peer_nonce")
        self.peer_hello = hello
        return self._make(now_us, peer_nonce=hello.nonce, peer_agent_id=hello.agent_id, peer_bytes=data)


@dataclass
class ServerHandshake(_Base):
    """The accepting side. Checks signature, version, freshness, binding, the named peer,
    the admission policy, and last the nonce (echo, then the replay cache).

    CLIENT_FIRST: ``initial()`` gives None; ``receive()`` checks the client's HELLO
    and returns the answer. SERVER_FIRST: ``initial()`` gives the server's HELLO;
    ``receive()`` checks the client's and returns None.

    ``receive()`` is :meth:`check`, then the nonce cache, then :meth:`accept`. An
    adapter whose cache does I/O (a shared store) calls the three itself, with the
    cache call off the event loop. The nonce is recorded only for a HELLO that
    verified and was admitted: a key the policy refuses cannot fill the cache.
    """

    nonce_cache: NonceStore | None = None
    admission: Callable[[str], bool] | None = None

    def initial(self, now_us: int) -> bytes | None:
        if self.order is HelloOrder.CLIENT_FIRST:
            return None
        hello = build_hello(
            self.identity, now_us=now_us, nonce=self.nonce, params=self.params, binding=self.binding
        )
        draft = HelloDraft(Role.SERVER, hello, Domain.HELLO_SERVER)
        self.sent_bytes = _finish(self.identity, draft, self.hook)
        return self.sent_bytes

    def receive(self, data: bytes, now_us: int) -> bytes | None:
        hello = self.check(data, now_us)
        if self.nonce_cache is not None:
            self.nonce_cache.check_and_add(hello.nonce, now_us, max_skew_us=self.max_skew_us)
        return self.accept(hello, data, now_us)

    def check(self, data: bytes, now_us: int) -> Hello:
        """Every check on the client's HELLO but the nonce cache (admission included);
        returns the HELLO, which is not yet accepted."""
        hello = self._open_checked(data, now_us, Role.CLIENT)
        me = self.identity.agent_id
        if self.order is HelloOrder.SERVER_FIRST:
            if hello.peer_agent_id != me:
                raise HandshakeError(
                    "client HELLO does not name this node in peer_agent_id", reason="wrong_peer"
                )
            if not secrets.compare_digest(hello.peer_nonce, self.nonce):
                raise HandshakeError(
                    "client HELLO does not echo this connection's server nonce", reason="replayed_hello"
                )
        else:
            if hello.peer_agent_id and hello.peer_agent_id != me:
                raise HandshakeError(
                    f"client dialed {hello.peer_agent_id[:16]}…, this node is {me[:16]}…", reason="wrong_peer"
                )
            if hello.peer_nonce:
                raise HandshakeError("a client HELLO that goes first carries no peer_nonce")
        if self.admission is not None and not self.admission(hello.agent_id):
            raise HandshakeError(
                f"{hello.agent_id[:16]}… is not admitted by this node's policy", reason="admission_denied"
            )
        return hello

    def accept(self, hello: Hello, data: bytes, now_us: int) -> bytes | None:
        """Accept a HELLO that passed :meth:`check` and whose nonce is recorded; return the
        answer (CLIENT_FIRST) or None."""
        if self.peer_hello is not None:
            raise HandshakeError("a second HELLO on this connection", reason="unexpected_hello")
        self.peer_hello = hello
        if self.order is HelloOrder.SERVER_FIRST:
            return None
        answer = build_hello(
            self.identity,
            now_us=now_us,
            nonce=self.nonce,
            params=self.params,
            peer_nonce=hello.nonce,
            peer_agent_id=hello.agent_id,
            binding=self.binding,
        )
        draft = HelloDraft(Role.SERVER, answer, Domain.HELLO_SERVER, data)
        self.sent_bytes = _finish(self.identity, draft, self.hook)
        return self.sent_bytes


# --- GOAWAY and close codes -------------------------------------------------------------------

#: The reason of each close code that means "the handshake was refused".
_HANDSHAKE_REASONS: dict[int, str] = {
    r.close: r.name for r in REASONS.values() if r.cls is HandshakeError and r.close is not None
}


def close_code_name(code: int) -> str:
    try:
        return CloseCode(code).name.lower()
    except ValueError:
        return f"code 0x{code:02x}"


def encode_goaway(code: int, reason: str) -> bytes:
    """A GOAWAY body (the caller wraps it in a frame)."""
    return GoAway(code=int(code), reason=reason[:MAX_REASON]).SerializeToString(deterministic=True)


def decode_goaway(body: bytes) -> tuple[int, str]:
    """``(code, reason)`` of a GOAWAY body; a malformed one reads as PROTOCOL_ERROR."""
    try:
        msg = GoAway.FromString(body)
    except Exception:  # any parse failure means the same here
        return int(CloseCode.PROTOCOL_ERROR), "malformed GOAWAY"
    return msg.code, msg.reason[:MAX_REASON]


def error_from_close(code: int, reason: str, *, during_handshake: bool = False) -> IacError:
    """The error the other side of a close raises.

    A handshake refusal (one of the HELLO close codes) becomes the same
    :class:`HandshakeError` subclass the refusing side raised; anything else is a
    :class:`ConnectionClosed` carrying ``code`` and ``peer_reason``.
    """
    name = _HANDSHAKE_REASONS.get(code)
    if name is not None:
        err: IacError = HandshakeError(f"peer refused the handshake ({name}): {reason}", reason=name)
    else:
        where = "during the handshake" if during_handshake else ""
        text = f"peer closed the connection {where} ({close_code_name(code)})".replace("  ", " ")
        err = ConnectionClosed(f"{text}: {reason}" if reason else text, code, reason)
    return err


def handshake_codes() -> Sequence[int]:
    """Close codes that mean "the handshake was refused"."""
    return sorted(_HANDSHAKE_REASONS)


__all__ = [
    "ALPN",
    "DEFAULT_MAX_SKEW_US",
    "DEFAULT_NONCE_CACHE_SIZE",
    "INSTANCE_CAPABILITY",
    "NONCE_SIZE",
    "PROTOCOL_VERSION",
    "ClientHandshake",
    "HelloDraft",
    "HelloHook",
    "HelloOrder",
    "HelloParams",
    "NonceCache",
    "NonceStore",
    "Role",
    "ServerHandshake",
    "build_hello",
    "channel_binding",
    "close_code_name",
    "decode_goaway",
    "encode_goaway",
    "error_from_close",
    "handshake_codes",
    "instance_of",
    "process_instance",
]
