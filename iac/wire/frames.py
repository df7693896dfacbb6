"""Frames: ``type:u8 | flags:u8 | length:varint | body[length]``.

Sans-IO: :func:`encode_frame` returns bytes, :func:`decode_frame` reads exactly
one frame, and :class:`FrameDecoder` accepts bytes in any chunking (TCP, UNIX
sockets, QUIC streams) and returns whole frames. Limits are checked before any
memory is committed: a declared length above ``max_frame_size`` is refused as
soon as the varint is read, and a zstd body must declare a content size between
1 and ``max_frame_size`` in its header, with nothing after the zstd frame.

A receiver that must not inflate what it is not ready to take reads
:class:`PackedFrame` objects (:meth:`FrameDecoder.feed_packed`): header and zstd
layout checked, the body still compressed, its decompressed ``size`` known from the
zstd header. :meth:`PackedFrame.unpack` decompresses one when it is taken.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import zstandard

from iac.errors import ProtocolError
from iac.wire.dicts import NO_DICTIONARY, Dictionary, DictionarySet
from iac.wire.elide import MAX_ELIDED_BODY, restore_forward
from iac.wire.scan import decode_varint, encode_varint

#: The largest frame a node reads or writes unless configured otherwise (4 MiB; ``max_frame_size``).
DEFAULT_MAX_FRAME_SIZE = 4 * 1024 * 1024
#: type + flags + the longest varint
MAX_HEADER_SIZE = 12
FLAG_ZSTD = 0x01
_KNOWN_FLAGS = FLAG_ZSTD
_ZSTD_MAGIC = 0xFD2FB528
_ZSTD_BLOCK_MAX = 128 * 1024
#: A partial body is held as pieces; chunks smaller than _SMALL are gathered into pieces of
#: up to _PIECE bytes.
_SMALL = 4096
_PIECE = 64 * 1024
#: Message field 3 (``msg_type``, a varint): what an elided MESSAGE body starts with.
_MSG_TYPE_TAG = 0x18


class FrameType(IntEnum):
    """The frame types of the wire format (docs/PROTOCOL.md, "Frames")."""

    MESSAGE = 0x01
    HELLO = 0x02
    FORWARD = 0x03
    DICT = 0x04
    GOAWAY = 0x05
    DICT_ACK = 0x06


_FRAME_TYPES = frozenset(int(t) for t in FrameType)
_TYPE_BY_CODE = {int(t): t for t in FrameType}
_ZSTD_MAGIC_BYTES = _ZSTD_MAGIC.to_bytes(4, "little")


#: The two values made for every frame received are plain slotted dataclasses, read-only by
#: convention, not frozen ones: a frozen dataclass sets each field through ``object.__setattr__``,
#: about 1,250 CPU instructions a field (CPython 3.11), and a frame of each kind is made per
#: message (benchmarks/README.md, "The per-request path").
@dataclass(slots=True, weakref_slot=True)
class Frame:
    """A decoded frame. ``body`` is already decompressed; ``wire_size`` counts header and body.
    (Weak references to it are allowed: a receiver learns when its reader dropped it.) Read-only
    by convention."""

    type: FrameType
    body: bytes
    dict_id: int | None = None  # None: sent raw; 0: zstd without dictionary
    wire_size: int = 0


@dataclass(slots=True)
class PackedFrame:
    """A received frame whose header and zstd layout were checked, its body not yet decompressed
    (read-only by convention, as :class:`Frame`).

    ``payload`` is the body as it came (compressed when ``dict_id`` is not None);
    ``size`` is the body's size once decompressed: the content size the zstd header
    declares, or the raw body's length. A receiver counts ``cost`` against its budget
    before it inflates anything.
    """

    type: FrameType
    payload: bytes
    dict_id: int | None  # None: sent raw; 0: zstd without dictionary
    size: int
    wire_size: int
    #: Bytes this frame holds, compressed or decompressed, whichever is larger.
    cost: int

    def unpack(self, dictionaries: DictionarySet) -> Frame:
        """The decoded frame (decompressed with its dictionary from ``dictionaries``; a MESSAGE
        body gets its elided ``from``/``to`` back when ``dictionaries.restore_prefix`` is set, a
        compact FORWARD body its whole Forward when ``dictionaries.restore_forward`` is)."""
        if self.dict_id is None:
            plain = self.payload
        else:
            plain = _inflate(self.payload, self.dict_id, self.size, dictionaries)
        prefix = dictionaries.restore_prefix
        # restore(plain, prefix), written out: a body that starts with field 3 gets its prefix back
        if (
            prefix
            and self.type == FrameType.MESSAGE
            and plain
            and plain[0] == _MSG_TYPE_TAG
            and len(plain) <= MAX_ELIDED_BODY
        ):
            plain = prefix + plain
        elif self.type == FrameType.FORWARD and dictionaries.restore_forward is not None:
            plain = restore_forward(plain, *dictionaries.restore_forward)
        return Frame(self.type, plain, self.dict_id, self.wire_size)


def encode_frame(
    ftype: FrameType,
    body: bytes,
    *,
    compress_with: Dictionary | None = None,
    plain_zstd: bool = False,
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
) -> bytes:
    """Encode one frame, zstd-compressed when that makes it smaller.

    ``compress_with`` picks a dictionary; ``plain_zstd`` compresses without
    one; with neither the body goes raw.
    """
    n = len(body)
    if n > max_frame_size:
        raise ProtocolError(
            f"frame body is {n} bytes, above max_frame_size {max_frame_size}: send large data "
            "as a file (Node.send_file, in chunks), or raise TransportConfig.max_frame_size on both sides",
            reason="frame_too_large",
        )
    flags = 0
    if compress_with is not None or plain_zstd:
        packed = (compress_with or NO_DICTIONARY).compress(body)
        m = len(packed)
        if m < n:
            body, n, flags = packed, m, FLAG_ZSTD
    if n < 0x80:
        return bytes((ftype, flags, n)) + body
    if n < 0x4000:  # a two-byte length (128 B .. 16 KiB), written out
        return bytes((ftype, flags, n & 0x7F | 0x80, n >> 7)) + body
    return bytes((ftype, flags)) + encode_varint(n) + body


def zstd_frame_info(body: bytes | memoryview, max_size: int) -> tuple[int, int]:
    """Check a zstd frame's header and block layout; return ``(dict_id, content_size)``.

    Raises ``compression_error`` (or a finer reason) when the body is not exactly one
    zstd frame that declares its content size, at most ``max_size``.
    """
    n = len(body)
    if n < 6 or body[0:4] != _ZSTD_MAGIC_BYTES:
        raise ProtocolError("compressed body is not a zstd frame", reason="compression_error")
    fhd = body[4]
    if fhd & 0x08:
        raise ProtocolError("zstd frame header has the reserved bit set", reason="compression_error")
    fcs_flag = fhd >> 6
    single_segment = (fhd >> 5) & 1
    has_checksum = (fhd >> 2) & 1
    did_size = (0, 1, 2, 4)[fhd & 3]
    fcs_size = (single_segment, 2, 4, 8)[fcs_flag]
    pos = 5 + (0 if single_segment else 1)
    if pos + did_size + fcs_size > n:
        raise ProtocolError("zstd frame header is truncated", reason="compression_error")
    dict_id = int.from_bytes(body[pos : pos + did_size], "little") if did_size else 0
    pos += did_size
    if fcs_size == 0:
        raise ProtocolError("zstd frame does not declare its content size", reason="missing_content_size")
    if fcs_size == 1:
        content_size = body[pos]
    elif fcs_size == 2:
        content_size = (body[pos] | body[pos + 1] << 8) + 256
    else:
        content_size = int.from_bytes(body[pos : pos + fcs_size], "little")
    pos += fcs_size
    if content_size == 0:
        raise ProtocolError("zstd frame declares a content size of 0", reason="zero_content_size")
    if content_size > max_size:
        raise ProtocolError(
            f"zstd frame declares {content_size} bytes, above max_frame_size {max_size}",
            reason="decompression_bomb",
        )
    while True:
        if pos + 3 > n:
            raise ProtocolError("zstd frame is truncated inside a block header", reason="compression_error")
        header = body[pos] | body[pos + 1] << 8 | body[pos + 2] << 16
        pos += 3
        last = header & 1
        btype = (header >> 1) & 3
        bsize = header >> 3
        if btype == 3:
            raise ProtocolError("zstd block of reserved type", reason="compression_error")
        if bsize > _ZSTD_BLOCK_MAX:
            raise ProtocolError("zstd block larger than 128 KiB", reason="compression_error")
        pos += 1 if btype == 1 else bsize
        if pos > n:
            raise ProtocolError("zstd frame is truncated inside a block", reason="compression_error")
        if last:
            break
    if has_checksum:
        pos += 4
        if pos > n:
            raise ProtocolError("zstd frame is truncated inside its checksum", reason="compression_error")
    if pos != n:
        raise ProtocolError(f"{n - pos} bytes follow the zstd frame", reason="trailing_data")
    return dict_id, content_size


def decompress_body(body: bytes, dictionaries: DictionarySet, max_frame_size: int) -> tuple[bytes, int]:
    """Check and decompress a zstd frame body; return ``(plain, dict_id)``."""
    dict_id, content_size = zstd_frame_info(body, max_frame_size)
    return _inflate(body, dict_id, content_size, dictionaries), dict_id


def _inflate(body: bytes, dict_id: int, content_size: int, dictionaries: DictionarySet) -> bytes:
    """Decompress a zstd frame that :func:`zstd_frame_info` checked."""
    dctx = dictionaries.require(dict_id)
    try:
        plain = dctx.decompress(body)
    except zstandard.ZstdError as exc:
        raise ProtocolError(f"zstd frame does not decompress: {exc}", reason="compression_error") from None
    if len(plain) != content_size:
        raise ProtocolError("zstd frame content differs from its declared size", reason="compression_error")
    return plain


def _check_header(ftype: int, flags: int) -> FrameType:
    if ftype not in _FRAME_TYPES:
        raise ProtocolError(f"unknown frame type 0x{ftype:02x}", reason="unknown_frame_type")
    if flags & ~_KNOWN_FLAGS:
        raise ProtocolError(
            f"unknown frame flag bits 0x{flags & ~_KNOWN_FLAGS:02x}", reason="unknown_frame_flag"
        )
    return FrameType(ftype)


def _pack(ftype: FrameType, flags: int, body: bytes, max_frame_size: int, wire: int) -> PackedFrame:
    """A whole frame, its zstd layout checked (not decompressed)."""
    if flags & FLAG_ZSTD:
        dict_id, content_size = zstd_frame_info(body, max_frame_size)
        return PackedFrame(
            ftype, body, dict_id, content_size, wire, content_size if content_size > wire else wire
        )
    n = len(body)
    return PackedFrame(ftype, body, None, n, wire, n if n > wire else wire)


def _parse_header(
    hdr: bytes | bytearray | memoryview, max_frame_size: int
) -> tuple[FrameType, int, int, int] | None:
    """Parse a frame header from the start of ``hdr``: ``(type, flags, length, header_size)``.

    Returns None when more bytes are needed; raises as soon as a fault is visible.
    """
    n = len(hdr)
    if n >= 3 and hdr[2] < 0x80:  # fast path: known type, no flag beyond zstd, one-byte length
        ftype = _TYPE_BY_CODE.get(hdr[0])
        if ftype is not None and not hdr[1] & ~_KNOWN_FLAGS:
            if hdr[2] > max_frame_size:
                raise ProtocolError(
                    f"frame declares {hdr[2]} bytes, above max_frame_size {max_frame_size}",
                    reason="frame_too_large",
                )
            return ftype, hdr[1], hdr[2], 3
    if n >= 4 and hdr[2] >= 0x80 and hdr[3] < 0x80:  # two-byte length (128 B .. 16 KiB)
        ftype = _TYPE_BY_CODE.get(hdr[0])
        if ftype is not None and not hdr[1] & ~_KNOWN_FLAGS:
            length = (hdr[2] & 0x7F) | (hdr[3] << 7)
            if length > max_frame_size:
                raise ProtocolError(
                    f"frame declares {length} bytes, above max_frame_size {max_frame_size}",
                    reason="frame_too_large",
                )
            return ftype, hdr[1], length, 4
    if n == 0:
        return None
    if hdr[0] not in _FRAME_TYPES:
        raise ProtocolError(f"unknown frame type 0x{hdr[0]:02x}", reason="unknown_frame_type")
    if n == 1:
        return None
    flags = hdr[1]
    if flags & ~_KNOWN_FLAGS:
        raise ProtocolError(
            f"unknown frame flag bits 0x{flags & ~_KNOWN_FLAGS:02x}", reason="unknown_frame_flag"
        )
    end = min(n, MAX_HEADER_SIZE)
    try:
        length, hend = decode_varint(hdr, 2, end)
    except ProtocolError as exc:
        if exc.reason != "truncated_frame":
            raise
        if end == MAX_HEADER_SIZE:
            raise ProtocolError("frame length varint longer than 10 bytes", reason="bad_varint") from None
        return None
    if length > max_frame_size:
        raise ProtocolError(
            f"frame declares {length} bytes, above max_frame_size {max_frame_size}", reason="frame_too_large"
        )
    return _TYPE_BY_CODE[hdr[0]], flags, length, hend


_EMPTY = DictionarySet()


def _whole_frame(data: bytes, max_frame_size: int) -> tuple[FrameType, int, int]:
    """Check that ``data`` is exactly one frame; return ``(type, flags, header_size)``."""
    parsed = _parse_header(data, max_frame_size)
    if parsed is None:
        raise ProtocolError("input ends inside a frame header", reason="truncated_frame")
    ftype, flags, length, hend = parsed
    end = hend + length
    if end > len(data):
        raise ProtocolError("input ends inside a frame body", reason="truncated_frame")
    if end < len(data):
        raise ProtocolError(f"{len(data) - end} bytes follow the frame", reason="frame_error")
    return ftype, flags, hend


def decode_frame_body(
    data: bytes, dictionaries: DictionarySet, max_frame_size: int
) -> tuple[FrameType, bytes]:
    """Decode exactly one frame that fills ``data``; return its type and (decompressed) body."""
    ftype, flags, hend = _whole_frame(data, max_frame_size)
    body = data[hend:]
    if flags & FLAG_ZSTD:
        body = decompress_body(body, dictionaries, max_frame_size)[0]
    return ftype, body


def decode_frame(
    data: bytes,
    *,
    dictionaries: DictionarySet = _EMPTY,
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
) -> Frame:
    """Decode exactly one frame that fills ``data``."""
    ftype, flags, hend = _whole_frame(data, max_frame_size)
    return _pack(ftype, flags, data[hend:], max_frame_size, len(data)).unpack(dictionaries)


class FrameDecoder:
    """Incremental frame reader for one byte stream.

    ``feed_packed`` takes any chunk and returns the frames it completed, still
    compressed (:class:`PackedFrame`): a receiver decompresses each when it is
    ready to take it. ``feed`` returns them decoded — every frame the chunk
    completed, decompressed at once (for tools and tests; a receiver that bounds
    its memory uses ``feed_packed``). The bytes kept between calls never exceed
    :data:`MAX_HEADER_SIZE` or ``max_frame_size``, whichever phase the decoder is
    in. After an error the decoder refuses further input (close the connection).
    """

    def __init__(
        self,
        *,
        dictionaries: DictionarySet = _EMPTY,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
    ) -> None:
        self.dictionaries = dictionaries
        self.max_frame_size = max_frame_size
        self._buf = bytearray()  # a partial header
        self._parts: list[bytes | bytearray] = []  # a partial body
        self._have = 0
        self._header: tuple[FrameType, int, int, int] | None = None
        self._failed = False

    @property
    def buffered(self) -> int:
        """Bytes held for a frame not yet complete."""
        return len(self._buf) + self._have

    @property
    def idle(self) -> bool:
        """True when no partial frame is held (a clean place for the stream to end)."""
        return self._header is None and not self._buf

    def feed(self, data: bytes | bytearray | memoryview, *, final: bool = False) -> list[Frame]:
        """Add bytes; return the frames they completed, decoded. ``final=True``: the stream ended here."""
        packed = self.feed_packed(data, final=final)
        try:
            return [p.unpack(self.dictionaries) for p in packed]
        except BaseException:
            self.discard()
            raise

    def feed_packed(self, data: bytes | bytearray | memoryview, *, final: bool = False) -> list[PackedFrame]:
        """Add bytes; return the frames they completed, not decompressed. ``final=True``:
        the stream ended here."""
        if self._failed:
            raise ProtocolError("frame decoder used after an error", reason="frame_error")
        try:
            mv = memoryview(data)
            out: list[PackedFrame] = []
            pos = 0
            n = len(mv)
            buf = self._buf
            max_size = self.max_frame_size
            while True:
                if self._header is None:
                    if buf:
                        take = mv[pos : pos + MAX_HEADER_SIZE - len(buf)]
                        before = len(buf)
                        buf += take
                        parsed = _parse_header(buf, max_size)
                        if parsed is None:
                            pos += len(take)
                            break
                        pos += parsed[3] - before
                        buf.clear()
                    else:
                        if pos >= n:
                            break
                        parsed = None
                        if n - pos >= 4:  # _parse_header's two fast paths, written out
                            ftype = _TYPE_BY_CODE.get(mv[pos])
                            flags, b2 = mv[pos + 1], mv[pos + 2]
                            if ftype is not None and not flags & ~_KNOWN_FLAGS:
                                if b2 < 0x80:
                                    if b2 <= max_size:
                                        parsed = (ftype, flags, b2, 3)
                                elif mv[pos + 3] < 0x80:
                                    length = (b2 & 0x7F) | (mv[pos + 3] << 7)
                                    if length <= max_size:
                                        parsed = (ftype, flags, length, 4)
                        if parsed is None:
                            parsed = _parse_header(mv[pos : pos + MAX_HEADER_SIZE], max_size)
                        if parsed is None:
                            buf += mv[pos:]
                            break
                        pos += parsed[3]
                    self._header = parsed
                ftype, flags, length, hend = self._header
                have = self._have
                body: bytes | bytearray
                if not have and n - pos >= length:
                    body = bytes(mv[pos : pos + length])
                    pos += length
                else:
                    take = mv[pos : pos + length - have]
                    pos += len(take)
                    self._keep(take)
                    if self._have < length:
                        break
                    body = self._parts[0] if len(self._parts) == 1 else b"".join(self._parts)
                    self._parts = []
                    self._have = 0
                self._header = None
                # _pack(ftype, flags, bytes(body), max_size, wire), written out (a call per frame)
                whole, wire = bytes(body), hend + length
                if flags & FLAG_ZSTD:
                    dict_id, size = zstd_frame_info(whole, max_size)
                    cost = size if size > wire else wire
                    out.append(PackedFrame(ftype, whole, dict_id, size, wire, cost))
                else:
                    out.append(PackedFrame(ftype, whole, None, length, wire, wire))
            if final and (self._header is not None or buf):  # not idle
                raise ProtocolError("stream ends inside a frame", reason="truncated_frame")
            return out
        except BaseException:
            self.discard()
            raise

    def discard(self) -> None:
        """Drop the partial frame held and refuse further input (the connection is over)."""
        self._failed = True
        self._buf = bytearray()
        self._parts = []
        self._have = 0
        self._header = None

    def _keep(self, take: memoryview) -> None:
        """Hold part of a body: as pieces, not one growing buffer (no copies as it grows, and
        no heap left behind by them); small pieces are gathered into one piece of at most
        :data:`_PIECE` bytes (no per-object overhead on bytes that came one by one)."""
        parts = self._parts
        last = parts[-1] if parts else None
        if len(take) < _SMALL and isinstance(last, bytearray) and len(last) + len(take) <= _PIECE:
            last += take
        elif len(take) < _SMALL:
            parts.append(bytearray(take))
        else:
            parts.append(bytes(take))
        self._have += len(take)
