import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

import iac
from iac.wire import FrameDecoder, FrameType, decode_frame, encode_frame
from iac.wire.frames import MAX_HEADER_SIZE, zstd_frame_info
from iac.wire.scan import encode_varint

TEXT = b'{"jsonrpc":"2.0","method":"tasks/send","params":{"task":"summarize the quarter"}}' * 4


def _dictionary() -> iac.wire.Dictionary:
    samples = [
        b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"web_search"}}' % i
        for i in range(400)
    ]
    return iac.wire.train(samples, 4096, dict_id=40000)


def test_raw_frame_layout():
    body = b"x" * 200
    data = encode_frame(FrameType.MESSAGE, body)
    assert data[:2] == b"\x01\x00"
    assert data[2:4] == encode_varint(200)
    frame = decode_frame(data)
    assert (frame.type, frame.body, frame.dict_id, frame.wire_size) == (
        FrameType.MESSAGE,
        body,
        None,
        len(data),
    )


def test_compression_used_only_when_it_shrinks():
    small = encode_frame(FrameType.MESSAGE, b"ab", plain_zstd=True)
    assert small[1] == 0  # raw: zstd would be larger
    big = encode_frame(FrameType.MESSAGE, TEXT, plain_zstd=True)
    assert big[1] == 1 and len(big) < len(TEXT)
    frame = decode_frame(big)
    assert frame.body == TEXT and frame.dict_id == 0


def test_dictionary_frames_name_their_dictionary():
    d = _dictionary()
    data = encode_frame(FrameType.MESSAGE, TEXT, compress_with=d)
    assert data[1] == 1
    frame = decode_frame(data, dictionaries=iac.wire.DictionarySet([d]))
    assert frame.body == TEXT and frame.dict_id == d.dict_id
    with pytest.raises(iac.errors.ProtocolError) as exc_info:
        decode_frame(data)
    assert exc_info.value.reason == "unknown_dictionary"


def test_oversized_length_refused_before_the_body_arrives():
    header = bytes((1, 0)) + encode_varint(5 * 1024 * 1024)
    dec = FrameDecoder(max_frame_size=4 * 1024 * 1024)
    with pytest.raises(iac.errors.ProtocolError) as exc_info:
        dec.feed(header)  # nothing of the body was needed to refuse it
    assert exc_info.value.reason == "frame_too_large"
    with pytest.raises(iac.errors.ProtocolError) as exc_info:
        dec.feed(b"more")  # the decoder stays failed
    assert exc_info.value.reason == "frame_error"


def test_encode_refuses_a_body_over_the_limit():
    with pytest.raises(iac.errors.ProtocolError) as exc_info:
        encode_frame(FrameType.MESSAGE, b"x" * 101, max_frame_size=100)
    assert exc_info.value.reason == "frame_too_large"


def test_header_faults():
    with pytest.raises(iac.errors.ProtocolError) as exc_info:
        decode_frame(b"\x09\x00\x00")
    assert exc_info.value.reason == "unknown_frame_type"
    with pytest.raises(iac.errors.ProtocolError) as exc_info:
        decode_frame(b"\x01\x02\x00")
    assert exc_info.value.reason == "unknown_frame_flag"
    with pytest.raises(iac.errors.ProtocolError) as exc_info:
        decode_frame(b"\x01\x00\x80")
    assert exc_info.value.reason == "truncated_frame"
    with pytest.raises(iac.errors.ProtocolError) as exc_info:
        decode_frame(b"\x01\x00" + b"\xff" * 10 + b"\x01")
    assert exc_info.value.reason == "bad_varint"
    with pytest.raises(iac.errors.ProtocolError) as exc_info:
        decode_frame(b"\x01\x00\x05abc")
    assert exc_info.value.reason == "truncated_frame"
    with pytest.raises(iac.errors.ProtocolError) as exc_info:
        decode_frame(b"\x01\x00\x01ab")  # a byte after the frame
    assert exc_info.value.reason == "frame_error"


def _zstd_frame(data: bytes, **kw) -> bytes:
    return zstandard.ZstdCompressor(**kw).compress(data)


def test_zstd_without_content_size_is_refused():
    cobj = zstandard.ZstdCompressor().compressobj()  # streaming: no content size
    body = cobj.compress(TEXT) + cobj.flush()
    with pytest.raises(iac.errors.ProtocolError) as exc_info:
        decode_frame(bytes((1, 1)) + encode_varint(len(body)) + body)
    assert exc_info.value.reason == "missing_content_size"


def test_decompression_bomb_refused_from_the_header():
    bomb = _zstd_frame(b"\x00" * (2 * 1024 * 1024))
    assert len(bomb) < 1024
    frame = bytes((1, 1)) + encode_varint(len(bomb)) + bomb
    with pytest.raises(iac.errors.ProtocolError) as info:
        decode_frame(frame, max_frame_size=1024 * 1024)
    assert info.value.reason == "decompression_bomb"
    assert info.value.close_code == iac.errors.CloseCode.FRAME_TOO_LARGE
    assert decode_frame(frame, max_frame_size=4 * 1024 * 1024).body == b"\x00" * (2 * 1024 * 1024)


def test_trailing_data_after_zstd_frame_refused():
    body = _zstd_frame(TEXT) + b"junk"
    with pytest.raises(iac.errors.ProtocolError) as exc_info:
        decode_frame(bytes((1, 1)) + encode_varint(len(body)) + body)
    assert exc_info.value.reason == "trailing_data"
    body = _zstd_frame(TEXT) * 2
    with pytest.raises(iac.errors.ProtocolError) as exc_info:
        decode_frame(bytes((1, 1)) + encode_varint(len(body)) + body)
    assert exc_info.value.reason == "trailing_data"


def test_lying_content_size_is_refused():
    good = _zstd_frame(TEXT, write_checksum=False)
    info = zstd_frame_info(good, 1 << 20)
    assert info == (0, len(TEXT))
    # Rewrite the declared size (2-byte FCS field: value - 256) to a smaller one.
    fhd = good[4]
    assert fhd >> 6 == 1
    lie = good[:6] + (len(TEXT) - 256 - 10).to_bytes(2, "little") + good[8:]
    with pytest.raises(iac.errors.ProtocolError) as exc_info:
        decode_frame(bytes((1, 1)) + encode_varint(len(lie)) + lie)
    assert exc_info.value.reason == "compression_error"


def test_declared_content_size_of_zero_is_refused():
    """zstd returns b"" for a frame that declares 0 bytes without reading the blocks after
    the header (or their checksum): such a frame would decode to nothing whatever it holds."""
    hidden = bytes((len(TEXT[:200]) << 3 | 1).to_bytes(3, "little")) + TEXT[:200]  # a raw block
    empty_declared = b"\x28\xb5\x2f\xfd" + bytes((0x20, 0)) + hidden  # 1-byte content size 0
    assert zstandard.ZstdDecompressor().decompress(empty_declared) == b""  # what the library does
    four_byte = b"\x28\xb5\x2f\xfd" + bytes((0xA0,)) + bytes(4) + hidden  # 4-byte content size 0
    for body in (empty_declared, four_byte, _zstd_frame(b"")):
        data = bytes((1, 1)) + encode_varint(len(body)) + body
        with pytest.raises(iac.errors.ProtocolError) as info:
            decode_frame(data)
        assert info.value.reason == "zero_content_size"
        assert info.value.reason == "zero_content_size"
        assert info.value.close_code == iac.errors.CloseCode.BAD_COMPRESSION
        with pytest.raises(iac.errors.ProtocolError) as exc_info:
            FrameDecoder().feed_packed(data)
        assert exc_info.value.reason == "zero_content_size"


def test_the_encoder_never_declares_a_content_size_of_zero():
    d = _dictionary()
    for frame in (
        encode_frame(FrameType.MESSAGE, b"", plain_zstd=True),
        encode_frame(FrameType.MESSAGE, b"", compress_with=d),
    ):
        assert frame == bytes((FrameType.MESSAGE, 0, 0))  # an empty body goes raw
    for body in (b"x", TEXT):
        frame = encode_frame(FrameType.MESSAGE, body, compress_with=d)
        assert decode_frame(frame, dictionaries=iac.wire.DictionarySet([d])).body == body


def test_packed_frames_stay_compressed_until_unpacked():
    """A read full of small frames each declaring 4 MiB: the decoder checks each zstd header
    and hands the frames out compressed, their decompressed size known; nothing is inflated
    until one is unpacked."""
    body = _zstd_frame(bytes(4 * 1024 * 1024), write_content_size=True)
    wire = bytes((1, 1)) + encode_varint(len(body)) + body
    packed = FrameDecoder().feed_packed(wire * 100)
    assert len(packed) == 100
    first = packed[0]
    assert first.size == 4 * 1024 * 1024 and first.payload == body and first.dict_id == 0
    assert first.wire_size == len(wire) and first.cost == 4 * 1024 * 1024
    assert first.unpack(iac.wire.DictionarySet()).body == bytes(4 * 1024 * 1024)
    raw = FrameDecoder().feed_packed(encode_frame(FrameType.MESSAGE, TEXT))[0]
    assert (raw.dict_id, raw.size, raw.payload) == (None, len(TEXT), TEXT)
    assert raw.unpack(iac.wire.DictionarySet()).body == TEXT


def test_a_partial_body_counts_every_byte_held():
    body = b"y" * 70000
    data = encode_frame(FrameType.MESSAGE, body)
    dec = FrameDecoder()
    for i in range(0, len(data) - 1, 1000):
        assert dec.feed_packed(data[i : min(i + 1000, len(data) - 1)]) == []
    assert dec.buffered == len(body) - 1  # the header is parsed, not held
    [frame] = dec.feed_packed(data[-1:])
    assert frame.payload == body and dec.buffered == 0 and dec.idle


def test_checksum_frames_are_accepted():
    body = _zstd_frame(TEXT, write_checksum=True)
    assert decode_frame(bytes((1, 1)) + encode_varint(len(body)) + body).body == TEXT


def test_streaming_decoder_any_chunking():
    d = _dictionary()
    frames = [
        encode_frame(FrameType.MESSAGE, TEXT, compress_with=d),
        encode_frame(FrameType.HELLO, b""),
        encode_frame(FrameType.GOAWAY, b"z" * 300),
        encode_frame(FrameType.MESSAGE, b"y" * 70000),
    ]
    stream = b"".join(frames)
    for size in (1, 2, 3, 7, 64, 1000, len(stream)):
        dec = FrameDecoder(dictionaries=iac.wire.DictionarySet([d]))
        out = []
        for i in range(0, len(stream), size):
            out += dec.feed(stream[i : i + size])
            assert dec.buffered <= 70000 + MAX_HEADER_SIZE
        assert [f.body for f in out] == [TEXT, b"", b"z" * 300, b"y" * 70000]
        assert dec.idle


def test_stream_ending_inside_a_frame_is_truncated():
    data = encode_frame(FrameType.MESSAGE, b"x" * 10)
    dec = FrameDecoder()
    assert dec.feed(data[:5]) == []
    with pytest.raises(iac.errors.ProtocolError) as exc_info:
        dec.feed(b"", final=True)
    assert exc_info.value.reason == "truncated_frame"


@settings(max_examples=300)
@given(st.binary(max_size=2000), st.lists(st.integers(min_value=1, max_value=64), min_size=1, max_size=50))
def test_any_bytes_any_chunking_yields_frames_or_iac_error(data, cuts):
    limit = 512
    dec = FrameDecoder(max_frame_size=limit)
    pos = 0
    i = 0
    try:
        while pos < len(data):
            n = cuts[i % len(cuts)]
            dec.feed(data[pos : pos + n])
            assert dec.buffered <= limit + MAX_HEADER_SIZE
            pos += n
            i += 1
        dec.feed(b"", final=True)
    except iac.IacError:
        pass


@given(st.lists(st.tuples(st.sampled_from(list(FrameType)), st.binary(max_size=600)), max_size=8), st.data())
def test_valid_frame_streams_round_trip_in_any_chunking(items, data):
    stream = b"".join(encode_frame(t, b, plain_zstd=True) for t, b in items)
    dec = FrameDecoder()
    out = []
    pos = 0
    while pos < len(stream):
        n = data.draw(st.integers(min_value=1, max_value=max(1, len(stream) - pos)))
        out += dec.feed(stream[pos : pos + n])
        pos += n
    dec.feed(b"", final=True)
    assert [(f.type, f.body) for f in out] == items


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (bytes((1, 0, 101)) + b"x" * 101, "frame_too_large"),  # one-byte length over the limit
        (bytes((1, 0)) + encode_varint(300) + b"x" * 300, "frame_too_large"),  # two-byte length
        (b"\x09\x00\x05" + b"x" * 5, "unknown_frame_type"),
        (b"\x01\x02\x05" + b"x" * 5, "unknown_frame_flag"),
    ],
)
def test_the_decoder_refuses_a_bad_header_that_arrives_whole(data: bytes, reason: str) -> None:
    """A header read in one piece with its body (the decoder's fast path) is refused as one
    read byte by byte is."""
    for chunks in ([data], [data[i : i + 1] for i in range(len(data))]):
        dec = FrameDecoder(max_frame_size=100)
        with pytest.raises(iac.errors.ProtocolError) as exc_info:
            for chunk in chunks:
                dec.feed_packed(chunk)
        assert exc_info.value.reason == reason
    ok = FrameDecoder(max_frame_size=300).feed_packed(bytes((1, 0)) + encode_varint(300) + b"x" * 300)
    assert [(p.type, p.size, p.wire_size) for p in ok] == [(FrameType.MESSAGE, 300, 304)]
