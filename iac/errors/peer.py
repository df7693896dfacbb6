"""Peer faults: the other side sent something wrong.

A :class:`ProtocolError` is malformed input and closes the connection it came
on with its ``close_code``; a :class:`MessageRejected` is a well-formed message
that failed a check: it is refused and counted, and the connection goes on.
"""

from __future__ import annotations

from typing import ClassVar

from iac.errors.base import CloseCode, IacError


class PeerError(IacError):
    """The remote side sent something that breaks the protocol or fails a check."""

    name = "peer_error"


class ProtocolError(PeerError):
    """Malformed input. The connection it arrived on is closed with ``close_code``."""

    name = "protocol_error"
    close_code: ClassVar[CloseCode] = CloseCode.PROTOCOL_ERROR


class FrameError(ProtocolError):
    """A frame could not be read."""

    name = "frame_error"


class FrameTooLarge(FrameError):
    """A frame's declared length or decompressed size is above ``max_frame_size``."""

    name = "frame_too_large"
    close_code = CloseCode.FRAME_TOO_LARGE


class UnknownFrameType(FrameError):
    """A frame header names a frame type this version does not know."""

    name = "unknown_frame_type"
    close_code = CloseCode.UNKNOWN_FRAME_TYPE


class UnknownFrameFlag(FrameError):
    """A frame header sets a flag bit this version does not know."""

    name = "unknown_frame_flag"
    close_code = CloseCode.UNKNOWN_FRAME_FLAG


class TruncatedFrame(FrameError):
    """The input ended inside a frame header, a varint or a body."""

    name = "truncated_frame"
    close_code = CloseCode.TRUNCATED_FRAME


class BadVarint(FrameError):
    """A length varint is longer than 10 bytes or overflows 64 bits."""

    name = "bad_varint"


class CompressionError(FrameError):
    """A compressed body is not one well-formed zstd frame."""

    name = "compression_error"
    close_code = CloseCode.BAD_COMPRESSION


class MissingContentSize(CompressionError):
    """A zstd body does not declare its content size in the frame header."""

    name = "missing_content_size"


class ZeroContentSize(CompressionError):
    """A zstd body declares a content size of 0 (such a frame decodes to nothing, whatever follows)."""

    name = "zero_content_size"


class DecompressionBomb(CompressionError, FrameTooLarge):
    """A zstd body declares a content size above ``max_frame_size``."""

    name = "decompression_bomb"
    close_code = CloseCode.FRAME_TOO_LARGE


class TrailingData(CompressionError):
    """Bytes follow the zstd frame inside a frame body."""

    name = "trailing_data"


class UnknownDictionary(CompressionError):
    """A zstd body names a dictionary id this side does not have."""

    name = "unknown_dictionary"
    close_code = CloseCode.UNKNOWN_DICTIONARY


class BufferExceeded(FrameError):
    """A connection's budget for partly received frames is spent."""

    name = "buffer_exceeded"
    close_code = CloseCode.BUFFER_EXCEEDED


class BadDictionary(ProtocolError):
    """A DICT or DICT_ACK frame is refused: malformed, a SHA-256 that does not match the
    content, too large, one push too many, or an ACK for a dictionary this side never pushed."""

    name = "bad_dictionary"
    close_code = CloseCode.BAD_DICTIONARY


class MessageFormatError(ProtocolError):
    """A frame body is not a well-formed, unambiguous protobuf message."""

    name = "malformed_message"
    close_code = CloseCode.MALFORMED_MESSAGE


class SignatureFieldMissing(MessageFormatError):
    """The message has no signature field (field 8)."""

    name = "signature_missing"


class SignatureFieldRepeated(MessageFormatError):
    """The message carries its signature field more than once."""

    name = "signature_repeated"


class SignatureFieldInvalid(MessageFormatError):
    """The signature field is not length-delimited or not 64 bytes."""

    name = "signature_invalid"


class FieldRepeated(MessageFormatError):
    """A singular field occurs more than once."""

    name = "field_repeated"


class HandshakeError(ProtocolError):
    """A HELLO failed a check; the connection is closed."""

    name = "handshake_failed"
    close_code = CloseCode.HANDSHAKE_FAILED


class HelloSignatureInvalid(HandshakeError):
    """The HELLO's signature does not verify under the key its ``agent_id`` names."""

    name = "hello_bad_signature"
    close_code = CloseCode.BAD_HELLO_SIGNATURE


class WrongPeer(HandshakeError):
    """The peer's AgentId is not the one that was dialed."""

    name = "wrong_peer"
    close_code = CloseCode.WRONG_PEER


class StaleHello(HandshakeError):
    """The HELLO's timestamp is outside the allowed clock skew."""

    name = "stale_hello"
    close_code = CloseCode.STALE_HELLO


class ReplayedHello(HandshakeError):
    """The HELLO (its nonce) was seen before: a replayed handshake."""

    name = "replayed_hello"
    close_code = CloseCode.REPLAYED_HELLO


class ChannelBindingMismatch(HandshakeError):
    """The HELLO's ``channel_binding`` (the server certificate's SHA-256 as its sender saw it) is
    not this connection's."""

    name = "channel_binding_mismatch"
    close_code = CloseCode.CHANNEL_BINDING


class AdmissionDenied(HandshakeError):
    """The server's admission policy refused the peer's AgentId at HELLO."""

    name = "admission_denied"
    close_code = CloseCode.ADMISSION_DENIED


class UnexpectedHello(HandshakeError):
    """A HELLO where none is expected: a second one on a connection, or one on a QUIC
    unidirectional stream."""

    name = "unexpected_hello"
    close_code = CloseCode.UNEXPECTED_HELLO


class Impersonation(ProtocolError):
    """A MESSAGE frame's ``from`` is not the peer that the connection's HELLO proved."""

    name = "impersonation"
    close_code = CloseCode.IMPERSONATION


class MessageRejected(PeerError):
    """A well-formed message failed a check. It is refused and counted; the connection goes on."""

    name = "message_rejected"


class McpBindingError(MessageRejected):
    """A payload of MCP over IAC that breaks the binding or its bounds. ``reason`` is the counter
    (``not_mcp``, ``bad_version``, ``bad_session``, ``too_large``, ``too_deep``, ``not_jsonrpc``)
    and ``code`` the JSON-RPC error code it is answered with (docs/PROTOCOL.md, section 23)."""

    name = "mcp_binding_error"

    def __init__(self, reason: str, message: str, code: int = -32600) -> None:
        super().__init__(message)
        self.reason = reason
        self.code = code


class McpUnsupported(PeerError):
    """The agent's HELLO does not announce MCP over IAC (``mcp/1``): nothing was sent to it."""

    name = "mcp_unsupported"


class InvalidAgentId(MessageRejected):
    """An AgentId is not 64 lowercase hex characters of a valid Ed25519 key."""

    name = "invalid_agent_id"


class BadSignature(MessageRejected):
    """The message's signature does not verify under its sender's key."""

    name = "bad_signature"


class StaleMessage(MessageRejected):
    """A timestamp is further than ``max_skew`` from now, or before a history-less store started."""

    name = "stale_message"


class ReplayedMessage(MessageRejected):
    """A (from, session_id, msg_id) was already accepted, or is older than the replay window."""

    name = "replayed_message"


class StreamOverrun(MessageRejected):
    """A stream's producer sent a part beyond the credit its consumer granted: the stream ends."""

    name = "stream_overrun"


class ReplayStoreFull(MessageRejected):
    """The replay store tracks ``max_sessions`` live sessions; a new session is refused.

    Live windows are never evicted to make room (that would re-open their
    replays), so under this pressure new senders wait until old sessions expire.
    """

    name = "replay_store_full"


class SealError(MessageRejected):
    """A sealed payload cannot be opened, is malformed, or its inner header does not match the message.

    Refused and counted like any failed check; an ERROR ``bad_request`` answers it.
    """

    name = "bad_seal"


class SealHeaderMismatch(SealError):
    """The sealed payload opened, but its inner header names another sender, recipient, session or id.

    Someone put another message's ciphertext in a message of their own (or moved
    it to other ids). ``mismatched`` lists the fields that differ.
    """

    name = "sealed_header_mismatch"

    def __init__(self, message: str, mismatched: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.mismatched = mismatched


# Registry records, key rotation and revocation (iac.protocol.records, iac.protocol.registry).


class BadRecord(MessageRejected):
    """A record or statement is malformed: not canonical JSON, wrong schema, or over a limit."""

    name = "bad_record"


class RecordExpired(MessageRejected):
    """A record's ``expires_us`` is not after now."""

    name = "record_expired"


class StaleSeq(MessageRejected):
    """A record or statement's ``seq`` is not above the one stored for its key (a replay)."""

    name = "stale_seq"


class AliasTaken(MessageRejected):
    """An alias belongs to another key (the first to register it) and no policy grants it."""

    name = "alias_taken"


class CommitmentChanged(MessageRejected):
    """A record drops or changes the ``next_key_digest`` that its key already committed to."""

    name = "commitment_changed"


class UncommittedSuccessor(MessageRejected):
    """A rotation names a successor whose digest is not the committed ``next_key_digest``."""

    name = "uncommitted_successor"


class RotationRefused(MessageRejected):
    """A rotation cannot apply: same key twice, the successor is already known, or a chain too long."""

    name = "rotation_refused"


class UnknownAgent(MessageRejected):
    """A statement names a key that the registry holds no record of."""

    name = "unknown_agent"


class KeyEnded(MessageRejected):
    """The key was rotated or revoked: it may publish nothing more."""

    name = "key_ended"


class KeyRotated(KeyEnded):
    """The key was rotated to a successor."""

    name = "key_rotated"


class KeyRevoked(KeyEnded):
    """The key was revoked."""

    name = "key_revoked"


class RegistryFull(MessageRejected):
    """The registry holds ``max_keys`` keys and none could be purged; a new key is refused."""

    name = "registry_full"


class RegistryQuota(RegistryFull):
    """The neighbour that relayed a publish brought in its quota of new keys this hour; refused."""

    name = "registry_quota"


# File transfer (iac.protocol.files) and relayed routing (iac.protocol.routing).


class FileTransferError(MessageRejected):
    """A FILE_TRANSFER payload or chunk was refused.

    ``fatal`` says whether the transfer is over (the receiver answers with a
    ``failed`` ack, :func:`failure_ack`) or only this chunk was refused (the
    sender sends it again after its timeout).
    """

    name = "file_transfer_error"
    fatal: ClassVar[bool] = False

    def __init__(self, message: str, transfer_id: str = "") -> None:
        super().__init__(message)
        self.transfer_id = transfer_id


class BadTransferPayload(FileTransferError):
    """The payload is not JSON, misses a field, or a field has the wrong type or range."""

    name = "bad_transfer_payload"
    fatal = True


class UnsafeFileName(FileTransferError):
    """The file name could escape the inbox or is otherwise refused (see the module doc)."""

    name = "unsafe_file_name"
    fatal = True


class FileTooLarge(FileTransferError):
    """The announced size is above the receiver's ``max_size``."""

    name = "file_too_large"
    fatal = True


class TransferMismatch(FileTransferError):
    """A chunk's name, size, total, chunk_size or sha256 differ from the transfer's first chunk."""

    name = "transfer_mismatch"
    fatal = True


class ChunkOutOfRange(FileTransferError):
    """``index`` is not below ``total``."""

    name = "chunk_out_of_range"


class BadChunkLength(FileTransferError):
    """The chunk's length is not what ``index``, ``chunk_size`` and ``size`` imply."""

    name = "bad_chunk_length"


class ChunkHashMismatch(FileTransferError):
    """The chunk's bytes do not match its ``chunk_sha256``; it is not written."""

    name = "chunk_hash_mismatch"


class FileHashMismatch(FileTransferError):
    """All chunks arrived but the file's SHA-256 is not the announced one; nothing is renamed."""

    name = "file_hash_mismatch"
    fatal = True


class TooManyTransfers(FileTransferError):
    """The receiver already runs ``max_transfers`` transfers; a new one is refused (try later)."""

    name = "too_many_transfers"


class FileExistsInInbox(FileTransferError):
    """A file of that name is already in the inbox and the receiver does not overwrite."""

    name = "file_exists"
    fatal = True


class RoutingError(MessageRejected):
    """A FORWARD frame was refused by the routing checks or the relay policy."""

    name = "routing_error"


class HopLimitExhausted(RoutingError):
    """The Forward arrived with ``hop_limit`` 0, or must go on but has no hop left."""

    name = "hop_limit_exhausted"


class RoutingLoop(RoutingError):
    """This node's own id is already in the Forward's ``path``."""

    name = "routing_loop"


class BadForwardPath(RoutingError):
    """``path`` is too long, holds a malformed or repeated id, or does not match origin and neighbour."""

    name = "bad_forward_path"


class RelayDenied(RoutingError):
    """The relay policy does not relay this origin, destination or kind of message."""

    name = "relay_denied"


class NoRoute(RoutingError):
    """No connected peer or known route leads to the destination."""

    name = "no_route"


class SeenCacheFull(RoutingError):
    """The broadcast seen-cache is full of unexpired keys; a new broadcast is refused."""

    name = "seen_cache_full"
