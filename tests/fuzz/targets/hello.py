"""HELLO: :func:`~iac.wire.message.open_hello` and both handshake state machines, in both orders.

Input: from the end, the entry point (0-5, see :data:`ENTRIES`) and who re-signs the HELLO (0:
nobody, it goes as it is; 1: the side that sends it; 2: a key nobody expects; 3: a key the
server does not admit); the rest is the HELLO. Re-signing parses the bytes as a ``Hello`` (when
they parse), sets ``agent_id`` to the signer's and signs it, so that the checks after the
signature -- version, freshness, nonce, binding, the named peer, the nonce cache, admission -- see
fuzzed fields too. The identities, nonces and binding are those of the HELLO test vectors; the
clock stands 0.4 ms after the client vector's timestamp.

Checked besides the bounds: a HELLO that a state machine accepted is refused as a second HELLO on
the same connection (``unexpected_hello``) and, on a server, as a replay on a new connection
that shares the nonce cache (``replayed_hello``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from google.protobuf.message import DecodeError

from iac.errors import IacError
from iac.protocol.handshake import ClientHandshake, HelloOrder, NonceCache, Role, ServerHandshake
from iac.wire._pb.iac_pb2 import Hello
from iac.wire.frames import DEFAULT_MAX_FRAME_SIZE, decode_frame_body
from iac.wire.identity import Domain, Identity
from iac.wire.message import open_hello, sign_hello
from tests.fuzz.bounds import Finding, check_error
from tests.fuzz.common import FuzzedDataProvider, Layout, vectors
from tests.fuzz.targets.frames import dictionaries

OPEN_CLIENT, OPEN_SERVER, SERVER_CF, CLIENT_CF, CLIENT_SF, SERVER_SF = range(6)
#: Entry point -> the role of the side that sent the fuzzed HELLO.
ENTRIES = {
    OPEN_CLIENT: Role.CLIENT,  # open_hello in the client domain
    OPEN_SERVER: Role.SERVER,  # open_hello in the server domain
    SERVER_CF: Role.CLIENT,  # a server (QUIC, TLS) receives the client's first HELLO
    CLIENT_CF: Role.SERVER,  # a client (QUIC, TLS) that sent its HELLO receives the answer
    CLIENT_SF: Role.SERVER,  # a client (UNIX) receives the server's first HELLO
    SERVER_SF: Role.CLIENT,  # a server (UNIX) that sent its HELLO receives the answer
}
AS_IS, SENDER, STRANGER, BANNED = range(4)
CLIENT_NONCE = bytes(range(16))
SERVER_NONCE = bytes(range(16, 32))
BINDING = b"_" * 32


@dataclass(frozen=True)
class Plan:
    entry: int
    signer: int  # AS_IS, SENDER, STRANGER, BANNED
    hello: bytes


def parse(data: bytes) -> Plan:
    fdp = FuzzedDataProvider(data)
    entry = fdp.ConsumeIntInRange(0, 5)
    signer = fdp.ConsumeIntInRange(0, 3)
    return Plan(entry, signer, fdp.ConsumeBytes(fdp.remaining_bytes()))


def layout(plan: Plan) -> bytes:
    return Layout().int(plan.entry, 0, 5).int(plan.signer, 0, 3).bytes(plan.hello).build()


@cache
def identities() -> dict[Role, Identity]:
    by_domain = {vec["domain"]: vec for vec in vectors("v1")["hello"]}
    return {
        role: Identity.from_seed(bytes.fromhex(by_domain[role.domain.value.decode()]["seed_hex"]))
        for role in Role
    }


@cache
def now_us() -> int:
    return int(vectors("v1")["hello"][0]["hello"]["timestamp"]) + 400


@cache
def stranger() -> Identity:
    return Identity.from_seed(b"\x06" * 32)


@cache
def banned() -> Identity:
    return Identity.from_seed(b"\x07" * 32)


def resign(data: bytes, sender: Role, signer: int) -> bytes:
    try:
        hello = Hello.FromString(data)
    except DecodeError:
        return data
    ident = {SENDER: identities()[sender], STRANGER: stranger(), BANNED: banned()}[signer]
    hello.agent_id = ident.agent_id
    return sign_hello(ident, hello, sender.domain)


def _server(order: HelloOrder, cache_: NonceCache) -> ServerHandshake:
    return ServerHandshake(
        identities()[Role.SERVER],
        order,
        binding=BINDING if order is HelloOrder.CLIENT_FIRST else b"",
        nonce=SERVER_NONCE,
        nonce_cache=cache_,
        admission=lambda agent_id: agent_id != banned().agent_id,
    )


def _client(order: HelloOrder) -> ClientHandshake:
    return ClientHandshake(
        identities()[Role.CLIENT],
        order,
        binding=BINDING if order is HelloOrder.CLIENT_FIRST else b"",
        nonce=CLIENT_NONCE,
        expect=identities()[Role.SERVER].agent_id,
    )


def _again(hs: ClientHandshake | ServerHandshake, data: bytes, now: int, expected: str) -> None:
    try:
        hs.receive(data, now)
    except IacError as exc:
        check_error(exc)
        if exc.reason != expected:
            raise Finding(
                f"an accepted HELLO sent again is refused with {exc.reason}, not {expected}"
            ) from exc
        return
    raise Finding(f"an accepted HELLO sent again passes (expected {expected})")


def TestOneInput(data: bytes) -> None:
    plan = parse(data)
    sender = ENTRIES[plan.entry]
    hello = resign(plan.hello, sender, plan.signer) if plan.signer != AS_IS else plan.hello
    now = now_us()
    if plan.entry in (OPEN_CLIENT, OPEN_SERVER):
        open_hello(hello, sender.domain)
        return
    if plan.entry in (SERVER_CF, SERVER_SF):
        order = HelloOrder.CLIENT_FIRST if plan.entry == SERVER_CF else HelloOrder.SERVER_FIRST
        nonces = NonceCache(max_entries=4)
        server = _server(order, nonces)
        server.initial(now)
        server.receive(hello, now)
        _again(server, hello, now, "unexpected_hello")
        _again(_server(order, nonces), hello, now, "replayed_hello")
        return
    client = _client(HelloOrder.CLIENT_FIRST if plan.entry == CLIENT_CF else HelloOrder.SERVER_FIRST)
    client.initial(now)
    client.receive(hello, now)
    _again(client, hello, now, "unexpected_hello")


def seeds() -> dict[str, bytes]:
    """The HELLO vectors (good, bad, and their unsigned fields to re-sign) at every entry point that
    takes them, and a valid HELLO for each UNIX entry point made by the state machines."""
    v1 = vectors("v1")
    out: dict[str, bytes] = {}
    for vec in v1["hello"]:
        signed, unsigned = bytes.fromhex(vec["signed_hex"]), bytes.fromhex(vec["unsigned_hex"])
        client = vec["domain"] == Domain.HELLO_CLIENT.value.decode()
        for entry in (OPEN_CLIENT, SERVER_CF) if client else (OPEN_SERVER, CLIENT_CF):
            out[f"{vec['name']}-{entry}"] = layout(Plan(entry, AS_IS, signed))
            for signer in (SENDER, STRANGER, BANNED):
                out[f"{vec['name']}-{entry}-signed-{signer}"] = layout(Plan(entry, signer, unsigned))
    for vec in v1["hello_negative"]:
        _type, body = decode_frame_body(
            bytes.fromhex(vec["frame_hex"]), dictionaries(), DEFAULT_MAX_FRAME_SIZE
        )
        client = vec["domain"] == Domain.HELLO_CLIENT.value.decode()
        for entry in (OPEN_CLIENT, SERVER_CF) if client else (OPEN_SERVER, CLIENT_CF):
            out[f"{vec['name']}-{entry}"] = layout(Plan(entry, AS_IS, body))
    now = now_us()
    server_first = _server(HelloOrder.SERVER_FIRST, NonceCache()).initial(now)
    assert server_first is not None
    answer = _client(HelloOrder.SERVER_FIRST).receive(server_first, now)
    assert answer is not None
    out["unix-server-hello"] = layout(Plan(CLIENT_SF, AS_IS, server_first))
    out["unix-client-answer"] = layout(Plan(SERVER_SF, AS_IS, answer))
    return out
