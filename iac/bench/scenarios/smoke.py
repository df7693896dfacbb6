"""The harness's smoke test (``iac bench --smoke``, run by ``make test``): a tiny plan through every
part of a run (turns, statistics, ratios, the environment probe, the JSON, the report, the
plots) on IAC's codec and bare PyNaCl Ed25519 over 50 corpus messages. Not a benchmark."""

from __future__ import annotations

import time
from collections.abc import Callable

import nacl.signing

from iac.bench.harness.paths import TEST_CORPUS
from iac.bench.harness.results import Context, Result, interleave
from iac.wire.dicts import DictionarySet, default_dictionary
from iac.wire.enums import MessageType
from iac.wire.identity import Identity
from iac.wire.message import Session, build_message, decode_message_frame, encode_message_frame

MESSAGES = 50
ROUNDS = 3
BASELINE = "bare PyNaCl Ed25519 sign + verify"
CODEC = "IAC codec encode + decode"


def _timed(fn: Callable[[], None]) -> Callable[[], float]:
    def step() -> float:
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) / MESSAGES * 1e6

    return step


def sc_smoke(ctx: Context, res: Result) -> None:
    lines = TEST_CORPUS.read_text(encoding="utf-8").splitlines()
    payloads = [ln for ln in lines if ln.strip()][:MESSAGES]
    a, b = Identity.from_seed(bytes(32)), Identity.from_seed(bytes([1]) * 32)
    d = default_dictionary()
    dset = DictionarySet([d])
    session = Session(1)
    sk = nacl.signing.SigningKey(bytes(32))

    def codec() -> None:
        for p in payloads:
            msg = build_message(
                sender=a.agent_id, to=b.agent_id, msg_type=MessageType.RUN, session=session,
                timestamp_us=time.time_ns() // 1000, payload_json=p,
            )  # fmt: skip
            decode_message_frame(encode_message_frame(a, msg, compress_with=d), dictionaries=dset)

    def bare() -> None:
        for p in payloads:
            raw = p.encode()
            sk.verify_key.verify(raw, sk.sign(raw).signature)

    steps = {CODEC: _timed(codec), BASELINE: _timed(bare)}
    figs = interleave(steps, ROUNDS, warmup=1, on_round=lambda r: ctx.progress(f"round {r + 1}/{ROUNDS}"))
    res.baseline = BASELINE
    for label, values in figs.items():
        res.add(label, "µs per message, both ends", "µs", values, iac=label == CODEC)
    res.series["per_round_us"] = {k: {str(i): v for i, v in enumerate(vs)} for k, vs in figs.items()}
    res.notes.append(f"Smoke test of the harness: {MESSAGES} messages, {ROUNDS} rounds; not a benchmark.")
