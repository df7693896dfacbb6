"""Edwards25519 arithmetic in plain integers, to build the keys an AgentId check must refuse.

Slow and not constant-time: only for test vectors and tests. It shares no code with
libsodium, so the tests that compare the two check one against the other.

* :data:`SMALL_ORDER`: the canonical encodings of the eight points of order 1, 2, 4 and 8;
* :func:`non_canonical`: ``y + p`` in the 255-bit field, optionally with the sign bit;
* :func:`mixed_order`: a valid key plus a point of order 8 (a curve point outside the
  prime-order subgroup; libsodium's signature check alone accepts it);
* :func:`sign_mixed_order`: a signature by such a key that libsodium's verify accepts;
* :func:`forge_small_order`: a signature by a small-order key that a plain cofactorless
  check (:func:`plain_verify`: RFC 8032 without libsodium's key checks) accepts.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

P = 2**255 - 19
L = 2**252 + 27742317777372353535851937790883648493
D = -121665 * pow(121666, P - 2, P) % P
_SQRT_M1 = pow(2, (P - 1) // 4, P)
_BASE_Y = 4 * pow(5, P - 2, P) % P

Point = tuple[int, int]
IDENTITY: Point = (0, 1)


def _x_of(y: int, sign: int) -> int | None:
    """The x with ``x`` odd iff ``sign`` on the curve at ``y``; None when there is none (RFC 8032 5.1.3)."""
    u, v = (y * y - 1) % P, (D * y * y + 1) % P
    x = u * pow(v, 3, P) * pow(u * pow(v, 7, P), (P - 5) // 8, P) % P
    if (v * x * x - u) % P:
        x = x * _SQRT_M1 % P
    if (v * x * x - u) % P:
        return None
    if x == 0 and sign:
        return None
    return P - x if x & 1 != sign else x


def add(a: Point, b: Point) -> Point:
    (x1, y1), (x2, y2) = a, b
    t = D * x1 * x2 * y1 * y2 % P
    return (x1 * y2 + x2 * y1) * pow(1 + t, P - 2, P) % P, (y1 * y2 + x1 * x2) * pow(1 - t, P - 2, P) % P


def mul(k: int, a: Point) -> Point:
    out = IDENTITY
    while k:
        if k & 1:
            out = add(out, a)
        a = add(a, a)
        k >>= 1
    return out


def encode(a: Point) -> bytes:
    x, y = a
    return (y | (x & 1) << 255).to_bytes(32, "little")


def decode(data: bytes) -> Point | None:
    """The point of a canonical encoding, else None (y >= p, x = 0 with the sign bit, no such x)."""
    n = int.from_bytes(data, "little")
    y, sign = n & (2**255 - 1), n >> 255
    if len(data) != 32 or y >= P:
        return None
    x = _x_of(y, sign)
    return None if x is None else (x, y)


BASE: Point = (_x_of(_BASE_Y, 0) or 0, _BASE_Y)
_ORDER_8_HEX = "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a"  # libsodium's blocklist
ORDER_8: Point = decode(bytes.fromhex(_ORDER_8_HEX)) or IDENTITY
#: k * ORDER_8 for k = 0..7: the identity, the point of order 2, two of order 4, four of order 8
SMALL_ORDER: tuple[bytes, ...] = tuple(encode(mul(k, ORDER_8)) for k in range(8))


def non_canonical(y: int, *, sign: bool = False) -> bytes:
    """The 32 bytes ``y + p`` (``y`` in 0..18), a non-canonical encoding of y."""
    if not 0 <= y < 2**255 - P:
        raise ValueError("only y = 0 .. 18 have a second encoding below 2**255")
    return ((y + P) | int(sign) << 255).to_bytes(32, "little")


def has_point(y: int) -> bool:
    """Whether some curve point has this y."""
    return _x_of(y % P, 0) is not None


def mixed_order(agent_id: str) -> str:
    """The AgentId of ``agent_id``'s point plus a point of order 8."""
    a = decode(bytes.fromhex(agent_id))
    if a is None:
        raise ValueError("not a point")
    return encode(add(a, ORDER_8)).hex()


def challenge(r: bytes, key: bytes, data: bytes) -> int:
    """Ed25519's ``h = SHA-512(R || A || M) mod L``."""
    return int.from_bytes(hashlib.sha512(r + key + data).digest(), "little") % L


def plain_verify(key: bytes, data: bytes, signature: bytes) -> bool:
    """RFC 8032's cofactorless check ``S B = R + h A`` with no check of ``A`` beyond decoding it."""
    a, r = decode(key), decode(signature[:32])
    s = int.from_bytes(signature[32:], "little")
    if a is None or r is None or s >= L:
        return False
    return mul(s, BASE) == add(r, mul(challenge(signature[:32], key, data), a))


def forge_small_order(key: bytes, make: Callable[[int], bytes]) -> tuple[bytes, bytes, int]:
    """``R`` = identity, ``S`` = 0 for a key whose order divides 8, over the first ``make(i)``
    (``i`` = 1, 2, ...) whose ``h`` is a multiple of 8: then ``S B = R + h A`` holds.

    Returns ``(data, signature, i)``.
    """
    r = encode(IDENTITY)
    for i in range(1, 1000):
        data = make(i)
        if challenge(r, key, data) % 8 == 0:
            return data, r + bytes(32), i
    raise RuntimeError("no challenge was a multiple of 8")  # pragma: no cover - odds 2**-190


def _scalar(seed: bytes) -> tuple[int, bytes]:
    h = hashlib.sha512(seed).digest()
    a = int.from_bytes(h[:32], "little")
    return (a & ~7 & (2**254 - 1)) | 2**254, h[32:]


def sign_mixed_order(seed: bytes, make: Callable[[int, str], bytes]) -> tuple[str, bytes, bytes, int]:
    """A signature by ``mixed_order(key of seed)`` that a cofactorless verifier accepts.

    ``make(i, agent_id)`` gives the signed bytes for attempt ``i`` (1, 2, ...); the first
    attempt whose challenge ``h`` is a multiple of 8 wins, since then ``h`` times the
    order-8 part is the identity and ``S = r + h a`` verifies for ``A + T``. Returns
    ``(agent_id, data, signature, i)``.
    """
    a, prefix = _scalar(seed)
    key = encode(add(mul(a, BASE), ORDER_8))
    agent_id = key.hex()
    for i in range(1, 1000):
        data = make(i, agent_id)
        r = int.from_bytes(hashlib.sha512(prefix + data).digest(), "little") % L
        big_r = encode(mul(r, BASE))
        h = challenge(big_r, key, data)
        if h % 8 == 0:
            return agent_id, data, big_r + ((r + h * a) % L).to_bytes(32, "little"), i
    raise RuntimeError("no challenge was a multiple of 8")  # pragma: no cover - odds 2**-190


def sign_identity_r(seed: bytes, data: bytes, r: bytes | None = None) -> bytes:
    """A signature by the (valid) key of ``seed`` whose ``R`` is the identity: ``S = h a``, so
    ``S B = h A = R + h A`` and a cofactorless check without libsodium's R rule accepts it.

    ``r`` replaces the 32 bytes of ``R`` (another encoding of the identity); ``h`` is computed over
    the bytes actually sent.
    """
    a, _ = _scalar(seed)
    big_r = r if r is not None else encode(IDENTITY)
    key = encode(mul(a, BASE))
    return big_r + (challenge(big_r, key, data) * a % L).to_bytes(32, "little")
