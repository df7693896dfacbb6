"""File transfer over FILE_TRANSFER messages, sans-IO: no sockets, no clock, no asyncio.

A file travels as numbered chunks, one per FILE_TRANSFER message: the chunk
header is JSON in ``payload_json`` and the chunk bytes are ``extra_data``.
The receiver answers with acknowledgements, also FILE_TRANSFER messages, whose
JSON says which chunks it holds. :class:`FileSender` keeps a window of chunks in
flight, re-queues what is not acknowledged in time and, after a broken
connection, resumes from the receiver's state so that acknowledged chunks are
never sent again; a sender started again for the same file names the same
transfer (:func:`transfer_id_for`) and resumes the same way. :class:`FileReceiver`
writes chunks at their offset into a temporary file in its inbox, checks the
whole file's SHA-256 and only then renames it into place (atomically), and
removes partial transfers abandoned for longer than a time to live. The node
moves the payloads; this package decides.

* :mod:`iac.protocol.files.payloads`: the payload formats (chunk header, ack,
  state query), their limits and checks;
* :mod:`iac.protocol.files.sender`: :class:`FileSender`;
* :mod:`iac.protocol.files.receiver`: :class:`FileReceiver`, and how a partial
  transfer survives a restart of the receiver;
* :mod:`iac.protocol.files.partials`: the receiver's temporary files in the inbox.
"""

from iac.errors import FileTransferError, TransferRefused
from iac.protocol.files.partials import PART_PREFIX
from iac.protocol.files.payloads import (
    MAX_ACK_RANGES,
    MIN_CHUNK_SIZE,
    AckPayload,
    AckStatus,
    ChunkHeader,
    StateQuery,
    check_file_name,
    chunk_count,
    chunk_length,
    error_for,
    failure_ack,
    new_transfer_id,
    parse_payload,
    transfer_id_for,
)
from iac.protocol.files.receiver import (
    DEFAULT_MAX_SIZE,
    DEFAULT_MAX_TRANSFERS,
    FileReceiver,
)
from iac.protocol.files.sender import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_WINDOW,
    MAX_WINDOW,
    ChunkToSend,
    FileSender,
    TransferProgress,
    default_chunk_size,
    hash_file,
)

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "DEFAULT_MAX_SIZE",
    "DEFAULT_MAX_TRANSFERS",
    "DEFAULT_WINDOW",
    "MAX_ACK_RANGES",
    "MAX_WINDOW",
    "MIN_CHUNK_SIZE",
    "PART_PREFIX",
    "AckPayload",
    "AckStatus",
    "ChunkHeader",
    "ChunkToSend",
    "FileReceiver",
    "FileSender",
    "FileTransferError",
    "StateQuery",
    "TransferProgress",
    "TransferRefused",
    "check_file_name",
    "chunk_count",
    "chunk_length",
    "default_chunk_size",
    "error_for",
    "failure_ack",
    "hash_file",
    "new_transfer_id",
    "parse_payload",
    "transfer_id_for",
]
