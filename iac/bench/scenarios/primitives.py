"""The codec pieces one request and its reply go through (:data:`iac.bench.harness.calibrate.PIECES`),
timed alone (``timeit``) and in sequence, and the codec's single-core decode rate; CPU time
(``time.process_time``), as the contenders' CPU per request is. benchmarks/README.md, "Node",
says what each piece covers and why the two timings differ."""

from __future__ import annotations

import json
import statistics
import time
import timeit
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from iac.bench.contenders import baselines
from iac.bench.contenders.floor import Codec
from iac.bench.harness.calibrate import PIECES
from iac.wire._pb.iac_pb2 import Message
from iac.wire.enums import MessageType
from iac.wire.frames import FLAG_ZSTD, FrameDecoder, FrameType, encode_frame
from iac.wire.identity import Domain, Identity, verify_signed
from iac.wire.jsonutil import dumps_compact
from iac.wire.message import build_message, decode_message_frame, sender_of, sign_message
from iac.wire.scan import MESSAGE_SCHEMA, SIGNATURE_SIZE, signature_span

_PREFIX = Domain.MESSAGE.value + b"\x00"  # what open_message puts before the unsigned bytes


@dataclass
class _Leg:
    """One direction's inputs and every intermediate form, ready for each piece."""

    sender: Codec
    receiver: Codec
    msg_type: int
    values: list[Any]
    texts: list[str]
    msgs: list[Message]
    signed: list[bytes]
    compressed: list[bytes]
    frames: list[bytes]
    bodies: list[bytes]
    joined: list[bytes]


def _leg(sender: Codec, receiver: Codec, msg_type: int, values: list[Any]) -> _Leg:
    texts = [dumps_compact(v) for v in values]
    msgs = [_build(sender, msg_type, t) for t in texts]
    signed = [sign_message(sender.identity, m) for m in msgs]
    compressed = [sender.send_dict.compress(s) for s in signed]
    frames = [encode_frame(FrameType.MESSAGE, s, compress_with=sender.send_dict) for s in signed]
    bodies = [p.unpack(receiver.dicts).body for f in frames for p in FrameDecoder().feed_packed(f)]
    joined = []
    for b in bodies:
        s, e = signature_span(b, MESSAGE_SCHEMA)
        joined.append(b[e - SIGNATURE_SIZE : e] + _PREFIX + b[:s] + b[e:])
    return _Leg(sender, receiver, msg_type, values, texts, msgs, signed, compressed, frames, bodies, joined)


def _build(sender: Codec, msg_type: int, text: str) -> Message:
    return build_message(
        sender=sender.me,
        to=sender.peer,
        msg_type=msg_type,
        session=sender.session,
        timestamp_us=time.time_ns() // 1000,
        payload_json=text,
    )


class Primitives:
    """The request and reply legs of ``payloads``, and :meth:`measure` to time every piece."""

    def __init__(self, payloads: list[Any]) -> None:
        a, b = Identity.generate(), Identity.generate()
        client, server = Codec(a, b.agent_id), Codec(b, a.agent_id)
        self.n = len(payloads)
        self.legs = (
            _leg(client, server, int(MessageType.RUN), payloads),
            _leg(server, client, int(MessageType.REPLY), [baselines.answer(p) for p in payloads]),
        )

    def _passes(self, leg: _Leg) -> dict[str, Callable[[], object]]:
        sender, mt = leg.sender, leg.msg_type
        ident, me = sender.identity, sender.me
        send_dict, dicts = sender.send_dict, leg.receiver.dicts

        def js() -> None:
            for v in leg.values:
                json.loads(dumps_compact(v))

        def build() -> None:
            for t in leg.texts:
                _build(sender, mt, t)

        def sign() -> None:
            for m in leg.msgs:
                sign_message(ident, m)

        def compress() -> None:
            for s in leg.signed:
                send_dict.compress(s)

        def frame_encode() -> None:
            for c in leg.compressed:
                encode_frame(FrameType.MESSAGE, c)

        def frame_decode() -> None:
            dec = FrameDecoder()
            for f in leg.frames:
                dec.feed_packed(f)

        packed = [p for f in leg.frames for p in FrameDecoder().feed_packed(f)]

        def decompress() -> None:
            for p in packed:
                p.unpack(dicts)

        def parse() -> None:
            for b in leg.bodies:
                signature_span(b, MESSAGE_SCHEMA)
                sender_of(Message.FromString(b))

        def verify() -> None:
            for j in leg.joined:
                verify_signed(me, j)

        passes = (js, build, sign, compress, frame_encode, frame_decode, decompress, parse, verify)
        return dict(zip(PIECES, passes, strict=True))

    def alone(self, repeat: int = 3) -> dict[str, float]:
        """µs of CPU per request (request + reply) for each piece timed alone, and their ``sum``."""
        out = dict.fromkeys(PIECES, 0.0)
        for leg in self.legs:
            for piece, fn in self._passes(leg).items():
                times = timeit.repeat(fn, timer=time.process_time, repeat=repeat, number=1)
                out[piece] += statistics.median(times) / self.n * 1e6
        out["sum"] = sum(out[p] for p in PIECES)
        return out

    def in_sequence(self) -> dict[str, float]:
        """The same pieces in one pass through the whole pipeline per message (request, then its
        reply), the CPU clock read between pieces (its own cost, measured first, taken off)."""
        clock = time.process_time
        t = clock()
        for _ in range(1000):
            clock()
        tick = (clock() - t) / 1000
        out = dict.fromkeys(PIECES, 0.0)
        pieces = PIECES
        decoders = [FrameDecoder() for _ in self.legs]
        for i in range(self.n):
            for leg, decoder in zip(self.legs, decoders, strict=True):
                sender, dicts, value = leg.sender, leg.receiver.dicts, leg.values[i]
                t0 = clock()
                text = dumps_compact(value)
                t1 = clock()
                msg = _build(sender, leg.msg_type, text)
                t2 = clock()
                signed = sign_message(sender.identity, msg)
                t3 = clock()
                body = sender.send_dict.compress(signed)
                t4 = clock()
                frame = encode_frame(FrameType.MESSAGE, body)
                t5 = clock()
                frame = frame[:1] + bytes((frame[1] | FLAG_ZSTD,)) + frame[2:]  # (not timed) as sent
                t6 = clock()
                (packed,) = decoder.feed_packed(frame)
                t7 = clock()
                plain = packed.unpack(dicts).body
                t8 = clock()
                s, e = signature_span(plain, MESSAGE_SCHEMA)
                got = Message.FromString(plain)
                t9 = clock()
                mv = memoryview(plain)
                verify_signed(sender_of(got), b"".join((mv[e - SIGNATURE_SIZE : e], _PREFIX, mv[:s], mv[e:])))
                t10 = clock()
                json.loads(got.payload_json)
                t11 = clock()
                spans = (t1 - t0 + t11 - t10, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t7 - t6, t8 - t7, t9 - t8,
                         t10 - t9)  # fmt: skip
                for piece, d in zip(pieces, spans, strict=True):
                    out[piece] += d
        n_ticks = {"json": 2}
        for piece in PIECES:
            out[piece] = max(0.0, out[piece] / self.n - 2 * n_ticks.get(piece, 1) * tick) * 1e6
        out["sum"] = sum(out[p] for p in PIECES)
        return out

    def measure(self) -> dict[str, dict[str, float]]:
        """Both ways of timing the pieces: ``{"alone": {...}, "in_sequence": {...}}``."""
        return {"alone": self.alone(), "in_sequence": self.in_sequence()}

    def decode_rate(self) -> float:
        """Messages/s of ``decode_message_frame`` over the request frames on one core (wall
        clock, one pass), as ``iac/bench/scenarios/codec.py`` measures decoding."""
        leg = self.legs[0]
        frames, dicts = leg.frames, leg.receiver.dicts
        t = time.perf_counter()
        for f in frames:
            decode_message_frame(f, dictionaries=dicts)
        return len(frames) / (time.perf_counter() - t)
