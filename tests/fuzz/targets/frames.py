"""The streaming frame decoder: any bytes, in any chunking, with a 64 KiB ``max_frame_size``.

Input: the stream from the front; from the end, how many chunk sizes (0-15) and the sizes (1-256
bytes each, used in turn; none: the whole stream at once). The last chunk is fed with
``final=True``.

Checked besides the bounds: the decoder never holds more than ``max_frame_size`` bytes between
calls, never returns a body above it, and refuses input after an error; and the chunking changes
nothing -- the fuzzed chunking and the whole stream at once both fail or both return the same
frames, and frames read still compressed (``feed_packed``) fail with the same error class in any
chunking.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from iac.errors import IacError, ProtocolError
from iac.wire.dicts import Dictionary, DictionarySet, default_dictionary
from iac.wire.frames import Frame, FrameDecoder
from tests.fuzz.bounds import Finding, check_error
from tests.fuzz.common import MAX_FRAME, VECTORS, FuzzedDataProvider, Layout, vectors


@dataclass(frozen=True)
class Plan:
    stream: bytes
    sizes: tuple[int, ...]


def parse(data: bytes) -> Plan:
    fdp = FuzzedDataProvider(data)
    sizes = tuple(fdp.ConsumeIntInRange(1, 256) for _ in range(fdp.ConsumeIntInRange(0, 15)))
    return Plan(fdp.ConsumeBytes(fdp.remaining_bytes()), sizes)


def layout(plan: Plan) -> bytes:
    out = Layout().int(len(plan.sizes), 0, 15)
    for size in plan.sizes:
        out.int(size, 1, 256)
    return out.bytes(plan.stream).build()


@cache
def dictionaries() -> DictionarySet:
    """The shipped dictionary and the test vectors' one, as a node that has both would decode."""
    return DictionarySet([default_dictionary(), Dictionary((VECTORS / "dict-48879.zdict").read_bytes())])


def chunks(stream: bytes, sizes: tuple[int, ...]) -> list[bytes]:
    if not sizes:
        return [stream]
    out, pos, i = [], 0, 0
    while pos < len(stream):
        out.append(stream[pos : pos + sizes[i % len(sizes)]])
        pos += len(out[-1])
        i += 1
    return out or [b""]


def decode(pieces: list[bytes], *, packed: bool = False) -> tuple[list[Any], type[IacError] | None]:
    """Feed ``pieces`` to a fresh decoder: the frames it returned, and the class of its error.

    ``packed``: read the frames still compressed (``feed_packed``), where the decoder has that.
    """
    decoder = FrameDecoder(dictionaries=dictionaries(), max_frame_size=MAX_FRAME)
    feed = decoder.feed_packed if packed else decoder.feed
    frames: list[Any] = []
    try:
        for n, piece in enumerate(pieces, 1):
            got = feed(piece, final=n == len(pieces))
            if decoder.buffered > MAX_FRAME:
                raise Finding(f"the decoder holds {decoder.buffered} bytes, above max_frame_size")
            frames.extend(got)
    except IacError as exc:
        check_error(exc)
        try:
            feed(b"")
        except ProtocolError:
            return frames, type(exc)
        raise Finding("the decoder takes input after an error") from exc
    for frame in frames:
        size = len(frame.body) if isinstance(frame, Frame) else frame.size
        if size > MAX_FRAME:
            raise Finding(f"a {frame.type.name} frame of {size} bytes passed")
    return frames, None


def _name(error: type[IacError] | None) -> str:
    return error.__name__ if error else "no error"


def TestOneInput(data: bytes) -> None:
    plan = parse(data)
    pieces = chunks(plan.stream, plan.sizes)
    chunked, error = decode(pieces)
    if not plan.sizes:
        return
    whole, whole_error = decode([plan.stream])
    if (error is None) != (whole_error is None) or (error is None and chunked != whole):
        raise Finding(
            f"fed in chunks the stream gives {len(chunked)} frames and {_name(error)}, "
            f"fed at once {len(whole)} frames and {_name(whole_error)}"
        )
    if hasattr(FrameDecoder, "feed_packed"):
        # Framing and the zstd layout are checked in stream order, whatever the chunking: the
        # same error class (decompression, done later, may meet its error before or after a
        # framing error further on, depending on where the chunks end).
        _, packed_error = decode(pieces, packed=True)
        _, whole_packed_error = decode([plan.stream], packed=True)
        if packed_error is not whole_packed_error:
            raise Finding(
                f"read packed, the stream ends with {_name(packed_error)} in chunks, "
                f"with {_name(whole_packed_error)} at once"
            )


def seeds() -> dict[str, bytes]:
    """Every frame of the message test vectors, at once and in small pieces."""
    v1 = vectors("v1")
    frames: dict[str, bytes] = {}
    for vec in v1["vectors"]:
        frames[f"{vec['name']}-raw"] = bytes.fromhex(vec["frame_raw_hex"])
        frames[f"{vec['name']}-zstd"] = bytes.fromhex(vec["frame_zstd_hex"])
    for vec in v1["accept"] + v1["negative"]:
        frames[vec["name"]] = bytes.fromhex(vec["frame_hex"])
    for vec in v1["hello"]:
        frames[vec["name"]] = bytes.fromhex(vec["frame_raw_hex"])
    out = {name: layout(Plan(frame, ())) for name, frame in frames.items()}
    first = v1["vectors"][0]
    two = bytes.fromhex(first["frame_raw_hex"]) + bytes.fromhex(first["frame_zstd_hex"])
    out["two-frames-bytewise"] = layout(Plan(two, (1,)))
    out["two-frames-in-3-7"] = layout(Plan(two, (3, 7)))
    return out
