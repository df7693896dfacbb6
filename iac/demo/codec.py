"""``iac demo --codec``: the codec on agent payloads, in one process.

A sample of the benchmark corpus (``iac/bench/corpus/test.jsonl``, shipped with the package; else
built-in payloads of the same shapes) is signed, compressed with the shipped dictionary, framed,
decoded and verified; a short table compares the sizes, and one tampered frame must be refused.
"""

from __future__ import annotations

import argparse
import random
import time
import uuid
from pathlib import Path

import zstandard

from iac.errors import IacError
from iac.wire.dicts import DEFAULT_LEVEL, DictionarySet, default_dictionary
from iac.wire.enums import MessageType
from iac.wire.frames import FrameType, encode_frame
from iac.wire.identity import Identity
from iac.wire.jsonutil import dumps_compact
from iac.wire.message import (
    Message,
    Session,
    build_message,
    decode_message_frame,
    encode_message_frame,
    sign_message,
)

DEFAULT_COUNT = 500
_CORPUS = Path("iac") / "bench" / "corpus" / "test.jsonl"
VOCABULARY = (
    "agent task plan step research summary draft review check deploy result error retry timeout context "
    "memory tool call response request user report revenue forecast model dataset metric latency cluster "
    "node service database query cache queue message stream file schema policy token key signature "
    "the a of to in for on with by from is are was be has will should and or but not this that"
)


def find_corpus() -> Path | None:
    """The benchmark suite's ``corpus/test.jsonl`` beside this package (shipped in the wheel), if there."""
    package = Path(__file__).resolve().parent.parent
    for root in (package.parent, Path.cwd()):
        path = root / _CORPUS
        if path.is_file():
            return path
    return None


def builtin_payloads(count: int, seed: int = 7) -> list[str]:
    """A small deterministic set in the corpus' shapes (A2A messages, hand-offs, tool calls)."""
    r = random.Random(seed)
    words = VOCABULARY.split()

    def text() -> str:
        return " ".join(r.choice(words) for _ in range(r.randint(8, 30))).capitalize() + "."

    def uid() -> str:
        return str(uuid.UUID(int=r.getrandbits(128), version=4))

    out: list[str] = []
    for i in range(count):
        kind = i % 3
        obj: dict[str, object]
        if kind == 0:
            parts = [{"kind": "text", "text": text()}]
            message = {"role": "user", "messageId": uid(), "contextId": uid(), "parts": parts}
            obj = {"jsonrpc": "2.0", "id": r.randint(1, 10**6), "method": "message/send"}
            obj["params"] = {"message": message}
        elif kind == 1:
            steps = r.randint(2, 9)
            task = {"task_id": uid(), "step": r.randint(1, steps), "steps": steps}
            task["state_ref"] = f"mem://researcher/{uid()}"
            obj = {"sender": "planner", "receiver": "researcher", "intent": "ASSIGN_TASK"}
            obj |= {"payload": text(), "task": task}
        else:
            call = {"name": "web_search", "arguments": {"query": text(), "max_results": r.randint(1, 20)}}
            obj = {"jsonrpc": "2.0", "id": r.randint(1, 10**6), "method": "tools/call", "params": call}
        out.append(dumps_compact(obj, ensure_ascii=True))
    return out


def load_payloads(count: int) -> tuple[list[str], str]:
    """Up to ``count`` payloads and where they came from."""
    path = find_corpus()
    if path is not None:
        lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        if lines:
            return lines[:count], f"{_CORPUS.as_posix()} ({len(lines[:count])} of {len(lines)})"
    return builtin_payloads(count), f"built-in samples ({count}; corpus not found)"


def run_codec_demo(args: argparse.Namespace) -> int:
    """The codec on agent payloads; print a short table; 0 when every frame decoded and verified."""
    count = int(getattr(args, "count", None) or DEFAULT_COUNT)
    payloads, source = load_payloads(count)
    alice, bob = Identity.generate(), Identity.generate()
    dictionary = default_dictionary()
    receiver = DictionarySet([dictionary])
    plain = zstandard.ZstdCompressor(level=DEFAULT_LEVEL, write_checksum=False, write_content_size=True)
    session = Session()
    now_us = time.time_ns() // 1000

    def message(payload: str) -> Message:
        return build_message(
            sender=alice.agent_id,
            to=bob.agent_id,
            msg_type=MessageType.DELEGATE_TASK,
            session=session,
            timestamp_us=now_us,
            payload_json=payload,
        )

    raw = zstd = zstd_dict = frames_raw = frames_dict = verified = 0
    t0 = time.perf_counter()
    for p in payloads:
        data = p.encode()
        raw += len(data)
        zstd += min(len(plain.compress(data)), len(data))
        zstd_dict += min(len(dictionary.compress(data)), len(data))
        msg = message(p)
        frame = encode_message_frame(alice, msg, compress_with=dictionary)
        frames_raw += len(encode_frame(FrameType.MESSAGE, msg.SerializeToString(deterministic=True)))
        frames_dict += len(frame)
        got = decode_message_frame(frame, dictionaries=receiver)
        if got.payload_json == p and got.msg_id == msg.msg_id:
            verified += 1
    elapsed = time.perf_counter() - t0

    # One tampered frame: a byte of the payload changed after signing, then compressed and framed.
    signed = bytearray(sign_message(alice, message(payloads[0])))
    at = signed.find(payloads[0].encode()[:16])
    signed[at + 2] ^= 0x01
    tampered = encode_frame(FrameType.MESSAGE, bytes(signed), compress_with=dictionary)
    try:
        decode_message_frame(tampered, dictionaries=receiver)
        refused = "ACCEPTED (bug!)"
        tamper_ok = False
    except IacError as exc:
        refused = f"refused: {type(exc).__name__} ({exc.reason})"
        tamper_ok = True

    n = len(payloads)
    print(f"IAC codec demo — {alice.agent_id[:12]}… → {bob.agent_id[:12]}…, payloads from {source}")
    print(f"dictionary {dictionary.dict_id} ({len(dictionary.content)} bytes, zstd level {dictionary.level})")
    print()
    print(f"  {'':<38} {'bytes':>10} {'per msg':>9} {'vs raw':>8}")
    rows = (
        ("payload_json, raw", raw),
        (f"payload_json, zstd {DEFAULT_LEVEL} (no dictionary)", zstd),
        ("payload_json, zstd + dictionary", zstd_dict),
        ("signed MESSAGE frames, raw", frames_raw),
        ("signed MESSAGE frames, zstd + dict", frames_dict),
    )
    for label, value in rows:
        print(f"  {label:<38} {value:>10} {value / n:9.1f} {value / raw:8.1%}")
    print()
    print(f"  messages: {n}; payload bytes saved by the dictionary: {1 - zstd_dict / raw:.1%}")
    print(f"  signatures verified: {verified}/{n} (encode+decode {elapsed / n * 1e6:.0f} µs per message)")
    print(f"  tampered frame: {refused}")
    return 0 if verified == n and tamper_ok else 1


__all__ = [
    "DEFAULT_COUNT",
    "VOCABULARY",
    "builtin_payloads",
    "find_corpus",
    "load_payloads",
    "run_codec_demo",
]
