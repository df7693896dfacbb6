"""Codec benchmark: IAC encode/decode next to bare Ed25519, and bytes on the wire.

    .venv/bin/python -m iac.bench.scenarios.codec                 # full run (test.jsonl, 2000 messages)
    .venv/bin/python -m iac.bench.scenarios.codec --quick         # smoke test (200 messages, 3 repetitions)
    .venv/bin/python -m iac.bench.scenarios.codec --json out.json # also write the results as JSON

The four passes (encode, sign, decode, verify), how they alternate, the ratio and the sizes are
in benchmarks/README.md, "Codec: what the benchmark measures"; ``envelope_http`` says what the
HTTP+JSON+SHA-256 column counts."""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import nacl.signing
import zstandard

from iac.bench.contenders.baselines import HTTP_PASSWORD, HTTP_PATH
from iac.bench.harness.environment import environment
from iac.bench.harness.paths import TEST_CORPUS
from iac.bench.harness.results import turn_order
from iac.bench.harness.stats import median
from iac.wire import (
    DictionarySet,
    Session,
    build_message,
    decode_message_frame,
    default_dictionary,
    encode_frame,
    encode_message_frame,
)
from iac.wire.dicts import DEFAULT_LEVEL
from iac.wire.enums import MessageType
from iac.wire.frames import FrameType
from iac.wire.identity import Domain, Identity, signing_input
from iac.wire.message import unsigned_bytes

TEST = TEST_CORPUS
SEED_A = bytes(range(32))
SEED_B = bytes(range(32, 64))
SESSION_ID = 0x5EED_1AC0_0000_0001
T0_US = 1_780_000_000_000_000
MSG_TYPE = MessageType.COMMAND
HTTP_HOST = "agent-b.example.net:8443"


def load_payloads(path: Path) -> list[str]:
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


# --- HTTP+JSON+SHA-256 envelope ------------------------------------------------------------------


def envelope_http(sender: str, to: str, payload_json: str, timestamp_us: int, msg_id: int) -> bytes:
    """The same message as an HTTP/1.1 POST with a compact JSON body and a SHA-256 "signature"
    (hex SHA-256 of payload+password): exactly what benchmarks/README.md, "Codec", lists; a lower
    bound for HTTP (no TLS, TCP/IP or headers real clients add)."""
    digest = hashlib.sha256((payload_json + HTTP_PASSWORD).encode()).hexdigest()
    head = (f'{{"from":"{sender}","to":"{to}","type":"{MSG_TYPE.name}","payload":').encode()
    tail = (
        f',"timestamp":{timestamp_us},"msg_id":{msg_id},"session_id":{SESSION_ID},"hash":"{digest}"}}'
    ).encode()
    body = head + payload_json.encode() + tail
    headers = (
        f"POST {HTTP_PATH} HTTP/1.1\r\nHost: {HTTP_HOST}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    return headers + body


# --- zstd frame header accounting ----------------------------------------------------------------


def zstd_overhead(frame: bytes) -> tuple[int, int]:
    """``(frame_header_bytes, block_header_bytes)`` of one zstd frame (no checksum is written)."""
    fhd = frame[4]
    single_segment = (fhd >> 5) & 1
    did = (0, 1, 2, 4)[fhd & 3]
    fcs = (single_segment, 2, 4, 8)[fhd >> 6]
    pos = 4 + 1 + (0 if single_segment else 1) + did + fcs
    header = pos
    blocks = 0
    while True:
        h = int.from_bytes(frame[pos : pos + 3], "little")
        pos += 3
        blocks += 3
        pos += 1 if (h >> 1) & 3 == 1 else h >> 3
        if h & 1:
            return header, blocks


# --- sizes ---------------------------------------------------------------------------------------


def measure_sizes(payloads: Sequence[str]) -> dict[str, object]:
    a, b = Identity.from_seed(SEED_A), Identity.from_seed(SEED_B)
    d = default_dictionary()
    plain = zstandard.ZstdCompressor(level=DEFAULT_LEVEL, write_checksum=False, write_content_size=True)
    session = Session(SESSION_ID)
    cols: dict[str, list[int]] = {
        k: []
        for k in (
            "payload_raw",
            "payload_zstd",
            "payload_zstd_dict",
            "frame_raw",
            "frame_zstd",
            "frame_zstd_dict",
            "http_json_sha256",
        )
    }
    zhdr: list[int] = []
    zblk: list[int] = []
    framed_raw = 0
    for i, p in enumerate(payloads):
        pb = p.encode()
        ts = T0_US + i * 1000
        msg = build_message(
            sender=a.agent_id,
            to=b.agent_id,
            msg_type=MSG_TYPE,
            session=session,
            timestamp_us=ts,
            payload_json=p,
        )
        signed = encode_message_frame(a, msg)  # raw frame; also signs msg in place
        body = msg.SerializeToString(deterministic=True)
        packed = d.compress(pb)
        cols["payload_raw"].append(len(pb))
        cols["payload_zstd"].append(len(plain.compress(pb)))
        cols["payload_zstd_dict"].append(len(packed))
        cols["frame_raw"].append(len(signed))
        cols["frame_zstd"].append(len(encode_frame(FrameType.MESSAGE, body, plain_zstd=True)))
        zframe = encode_frame(FrameType.MESSAGE, body, compress_with=d)
        cols["frame_zstd_dict"].append(len(zframe))
        if zframe[1] == 0:
            framed_raw += 1
        h, bl = zstd_overhead(d.compress(body))
        zhdr.append(h)
        zblk.append(bl)
        cols["http_json_sha256"].append(len(envelope_http(a.agent_id, b.agent_id, p, ts, msg.msg_id)))
    raw_total = sum(cols["payload_raw"])
    rows = {
        k: {"mean": statistics.fmean(v), "total": sum(v), "vs_payload_raw": sum(v) / raw_total}
        for k, v in cols.items()
    }
    return {
        "messages": len(payloads),
        "rows": rows,
        "payload_saving_dict": 1 - sum(cols["payload_zstd_dict"]) / raw_total,
        "payload_saving_plain_zstd": 1 - sum(cols["payload_zstd"]) / raw_total,
        "frames_sent_raw_with_dict": framed_raw,
        "zstd_frame_header_bytes_mean": statistics.fmean(zhdr),
        "zstd_block_header_bytes_mean": statistics.fmean(zblk),
        "dictionary": {
            "dict_id": d.dict_id,
            "size": len(d.content),
            "sha256": d.sha256.hex(),
            "level": d.level,
        },
    }


# --- timing --------------------------------------------------------------------------------------


def timed_pass(fn: Callable[[Any], object], items: Sequence[Any]) -> float:
    """Mean µs per item of ``fn`` over ``items``."""
    gc.collect()
    t = time.perf_counter()
    for x in items:
        fn(x)
    return (time.perf_counter() - t) / len(items) * 1e6


def measure_speed(payloads: Sequence[str], reps: int) -> dict[str, object]:
    a, b = Identity.from_seed(SEED_A), Identity.from_seed(SEED_B)
    d = default_dictionary()
    dset = DictionarySet([d])
    session = Session(SESSION_ID)
    sender, to = a.agent_id, b.agent_id

    def encode(p: str) -> bytes:
        msg = build_message(
            sender=sender, to=to, msg_type=MSG_TYPE, session=session, timestamp_us=T0_US, payload_json=p
        )
        return encode_message_frame(a, msg, compress_with=d)

    frames = [encode(p) for p in payloads]
    for f in frames:  # the decode pass must succeed on every frame
        decode_message_frame(f, dictionaries=dset)

    # Bare PyNaCl on the same bytes the codec signs and verifies.
    sk = nacl.signing.SigningKey(SEED_A)
    vk = sk.verify_key
    to_sign: list[bytes] = []
    for p in payloads:
        msg = build_message(
            sender=sender, to=to, msg_type=MSG_TYPE, session=session, timestamp_us=T0_US, payload_json=p
        )
        to_sign.append(signing_input(Domain.MESSAGE, unsigned_bytes(msg)))
    signed = [(m, sk.sign(m).signature) for m in to_sign]

    ops: dict[str, tuple[Callable[[Any], object], Sequence[Any]]] = {
        "encode": (encode, payloads),
        "sign": (lambda m: sk.sign(m), to_sign),
        "decode": (lambda f: decode_message_frame(f, dictionaries=dset), frames),
        "verify": (lambda ms: vk.verify(ms[0], ms[1]), signed),
    }
    for fn, items in ops.values():  # warm-up
        timed_pass(fn, items[: max(1, len(items) // 4)])
    times: dict[str, list[float]] = {k: [] for k in ops}
    for order in turn_order(list(ops), reps):
        for name in order:
            fn, items = ops[name]
            times[name].append(timed_pass(fn, items))
    med = {k: median(v) for k, v in times.items()}
    per_rep_ratio = [
        (s + v) / (e + dd)
        for e, s, dd, v in zip(times["encode"], times["sign"], times["decode"], times["verify"], strict=True)
    ]
    return {
        "messages": len(payloads),
        "repetitions": reps,
        "us_per_msg": {k: {"median": med[k], "min": min(v), "max": max(v)} for k, v in times.items()},
        "msgs_per_s": {k: 1e6 / med[k] for k in med},
        "codec_rate": 1e6 / (med["encode"] + med["decode"]),
        "ed25519_rate": 1e6 / (med["sign"] + med["verify"]),
        # each repetition's four passes ran back to back: their ratio is the least noisy figure
        "ratio": median(per_rep_ratio),
        "ratio_of_medians": (med["sign"] + med["verify"]) / (med["encode"] + med["decode"]),
        "ratio_min": min(per_rep_ratio),
        "ratio_max": max(per_rep_ratio),
        "overhead_us": {
            "encode": med["encode"] - med["sign"],
            "decode": med["decode"] - med["verify"],
        },
    }


# --- report --------------------------------------------------------------------------------------


def pin_one_core() -> int | None:
    """Pin this process to the core it runs on (Linux); return it, or None."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    try:
        cpus = sorted(os.sched_getaffinity(0))
        cpu = cpus[-1]
        os.sched_setaffinity(0, {cpu})
        return cpu
    except OSError:
        return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="IAC codec benchmark")
    parser.add_argument("--quick", action="store_true", help="small counts (smoke test)")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON")
    parser.add_argument("--corpus", type=Path, default=TEST, help="payloads, one JSON per line")
    parser.add_argument("--count", type=int, default=None, help="messages per timing pass")
    parser.add_argument("--reps", type=int, default=None, help="repetitions")
    parser.add_argument("--no-pin", action="store_true", help="do not pin the process to one core")
    args = parser.parse_args(argv)

    payloads = load_payloads(args.corpus)
    count = args.count or (200 if args.quick else len(payloads))
    reps = args.reps or (3 if args.quick else 9)
    cpu = None if args.no_pin else pin_one_core()
    res: dict[str, object] = {
        "environment": environment(),
        "pinned_cpu": cpu,
        "corpus": str(args.corpus.name),
        "speed": measure_speed(payloads[:count], reps),
        "sizes": measure_sizes(payloads),
    }
    from iac.bench.reports.live import print_rendered

    scenarios = [
        {"name": "codec", "status": "ok", "raw": res},
        {"name": "bytes", "status": "ok", "raw": res["sizes"]},
    ]
    module = "iac.bench.scenarios.codec"
    print_rendered(("codec-results",), module, {"scenarios": scenarios}, suite=True)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2) + "\n")
        print(f"\nresults written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
