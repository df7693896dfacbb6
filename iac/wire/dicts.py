"""zstd compression dictionaries: train, load, look up by id.

A dictionary is a zstd-format dictionary file (magic ``0xEC30A437``) whose
header carries its 32-bit ``dict_id``; it is content-addressed by the SHA-256
of the file. The package ships one default dictionary trained on agent
payloads (``iac/data/default.dict``).
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import zstandard

from iac.errors import ConfigError, ProtocolError
from iac.wire._pb.iac_pb2 import Message

ZSTD_DICT_MAGIC = b"\x37\xa4\x30\xec"
DEFAULT_LEVEL = 3
#: Dictionary ids IAC picks: two bytes in the zstd frame header, outside the
#: range zstd reserves for a registrar (0-32767).
DICT_ID_MIN = 32768
DICT_ID_MAX = 65535
#: Largest dictionary a node accepts from a file or a peer.
MAX_DICT_SIZE = 1 << 20
#: Ids of dictionaries derived per connection (:func:`derive_dictionary`): four bytes in
#: the zstd frame header, never one a trained dictionary gets, below zstd's reserved 2**31.
DERIVED_ID_MIN = 65536
DERIVED_ID_MAX = 2**31 - 1


@dataclass(eq=False)
class Dictionary:
    """One zstd dictionary with its compression and decompression contexts."""

    content: bytes
    level: int = DEFAULT_LEVEL
    dict_id: int = field(init=False)
    sha256: bytes = field(init=False)
    _cctx: zstandard.ZstdCompressor = field(init=False, repr=False)
    _dctx: zstandard.ZstdDecompressor = field(init=False, repr=False)
    #: Compress ``data`` (the context's own method: no Python call in between, per frame).
    compress: Callable[[bytes], bytes] = field(init=False, repr=False)
    #: Decompress one checked zstd frame (the caller validated its header).
    decompress: Callable[[bytes], bytes] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if len(self.content) > MAX_DICT_SIZE:
            raise ConfigError(f"dictionary is {len(self.content)} bytes, above {MAX_DICT_SIZE}")
        if not self.content.startswith(ZSTD_DICT_MAGIC) or len(self.content) < 8:
            raise ConfigError("not a zstd dictionary (missing magic 0xEC30A437)")
        self.dict_id = int.from_bytes(self.content[4:8], "little")
        if self.dict_id == 0:
            raise ConfigError("a dictionary must have a non-zero dict_id")
        self.sha256 = hashlib.sha256(self.content).digest()
        zd = zstandard.ZstdCompressionDict(self.content, dict_type=zstandard.DICT_TYPE_FULLDICT)
        zd.precompute_compress(level=self.level)
        self._cctx = zstandard.ZstdCompressor(
            dict_data=zd, write_checksum=False, write_content_size=True, write_dict_id=True
        )
        self._dctx = zstandard.ZstdDecompressor(dict_data=zd)
        self.compress = self._cctx.compress
        self.decompress = self._dctx.decompress

    @classmethod
    def load(cls, path: str | os.PathLike[str], level: int = DEFAULT_LEVEL) -> Dictionary:
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read dictionary: {exc.strerror}") from None
        try:
            return cls(data, level)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None

    def __repr__(self) -> str:
        return (
            f"Dictionary(dict_id={self.dict_id}, size={len(self.content)}, sha256={self.sha256.hex()[:16]}…)"
        )


class _NoDictionary:
    """Plain zstd, no dictionary (dict id 0 in the frame header)."""

    dict_id = 0

    def __init__(self, level: int = DEFAULT_LEVEL) -> None:
        self._cctx = zstandard.ZstdCompressor(
            level=level, write_checksum=False, write_content_size=True, write_dict_id=False
        )
        self._dctx = zstandard.ZstdDecompressor()
        self.compress: Callable[[bytes], bytes] = self._cctx.compress
        self.decompress: Callable[[bytes], bytes] = self._dctx.decompress


NO_DICTIONARY = _NoDictionary()


class DictionarySet:
    """The dictionaries a side can use, by id (preferred first).

    ``restore_prefix``: on a connection with elided ``from``/``to`` (:mod:`iac.wire.elide`),
    the prefix a MESSAGE body from the peer gets back when it is unpacked; empty elsewhere.
    ``restore_forward``: on a connection with compact Forwards (``elide-forward/1``), the
    (peer, self) AgentIds a compact FORWARD body from the peer is restored with; None elsewhere.
    """

    def __init__(self, dictionaries: Iterable[Dictionary] = ()) -> None:
        self._by_id: dict[int, Dictionary] = {}
        self.restore_prefix = b""
        self.restore_forward: tuple[str, str] | None = None
        for d in dictionaries:
            self.add(d)

    def add(self, d: Dictionary) -> None:
        old = self._by_id.get(d.dict_id)
        if old is not None and old.sha256 != d.sha256:
            raise ConfigError(f"two different dictionaries share dict_id {d.dict_id}")
        self._by_id.setdefault(d.dict_id, d)

    def get(self, dict_id: int) -> Dictionary | None:
        return self._by_id.get(dict_id)

    def require(self, dict_id: int) -> Dictionary | _NoDictionary:
        """The decompressor for ``dict_id`` (0: none); ``unknown_dictionary`` if absent."""
        if dict_id == 0:
            return NO_DICTIONARY
        d = self._by_id.get(dict_id)
        if d is None:
            raise ProtocolError(
                f"zstd frame names dictionary {dict_id}, which this side does not have",
                reason="unknown_dictionary",
            )
        return d

    def ids(self) -> list[int]:
        return list(self._by_id)

    def choose(self, receiver_ids: Iterable[int]) -> Dictionary | None:
        """The first dictionary the receiver listed that this side also has."""
        for i in receiver_ids:
            d = self._by_id.get(i)
            if d is not None:
                return d
        return None

    def __iter__(self) -> Iterator[Dictionary]:
        return iter(self._by_id.values())

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, dict_id: object) -> bool:
        return dict_id in self._by_id


def default_dictionary() -> Dictionary:
    """The dictionary shipped with the package, trained on agent payloads."""
    data = resources.files("iac").joinpath("data/default.dict").read_bytes()
    return Dictionary(data)


def derive_dictionary(base: Dictionary, tail: bytes) -> Dictionary:
    """``base`` with ``tail`` appended to its content and a fresh id.

    The content of a zstd dictionary is the end of the file, and the last bytes are the
    cheapest to refer to, so appending bytes that every frame repeats (a Message's
    ``from``/``to`` prefix) makes them a single match. The id is the first 8 bytes of the
    SHA-256 of the result with the id field zeroed, reduced to
    ``DERIVED_ID_MIN..DERIVED_ID_MAX``; the same base and tail always give the same
    dictionary.
    """
    body = base.content[8:] + tail
    digest = hashlib.sha256(ZSTD_DICT_MAGIC + bytes(4) + body).digest()
    span = DERIVED_ID_MAX - DERIVED_ID_MIN + 1
    dict_id = DERIVED_ID_MIN + int.from_bytes(digest[:8], "little") % span
    return Dictionary(ZSTD_DICT_MAGIC + dict_id.to_bytes(4, "little") + body, base.level)


def message_prefix(sender: str, receiver: str) -> bytes:
    """How a Message from ``sender`` to ``receiver`` starts: fields 1 and 2, tags and lengths."""
    msg = Message(to=receiver)
    setattr(msg, "from", sender)
    return msg.SerializeToString()


def train(
    samples: Iterable[bytes],
    size: int = 16384,
    *,
    dict_id: int | None = None,
    level: int = DEFAULT_LEVEL,
) -> Dictionary:
    """Train a zstd dictionary of at most ``size`` bytes on ``samples``."""
    items: list[bytes | bytearray | memoryview] = [s for s in samples if s]
    if len(items) < 8:
        raise ConfigError(f"need at least 8 non-empty samples to train a dictionary, got {len(items)}")
    if dict_id is None:
        dict_id = DICT_ID_MIN + secrets.randbelow(DICT_ID_MAX - DICT_ID_MIN + 1)
    if not 0 < dict_id < 2**32:
        raise ConfigError(f"dict_id must be in 1..2**32-1, got {dict_id}")
    try:
        zd = zstandard.train_dictionary(size, items, dict_id=dict_id, level=level)
    except zstandard.ZstdError as exc:
        raise ConfigError(f"dictionary training failed: {exc}") from None
    return Dictionary(zd.as_bytes(), level)
