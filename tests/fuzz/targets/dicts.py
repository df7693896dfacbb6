"""DICT and DICT_ACK frames: :class:`~iac.transport.session.DictState` of one new connection.

Input: from the end, how many frames (1-4), per frame its kind -- 0: a DICT body as it comes,
1: a DICT whose ``sha256`` matches its content (so that the content reaches zstd's dictionary
loader), with the content's own id or a fuzzed one, 2: a DICT_ACK body as it comes, 3: this side
pushes its dictionary to a peer (a fuzzed 32-byte key seed) and reads a DICT_ACK for it, with the
right id or a fuzzed one -- and the lengths, then whether the connection has pushing turned off
(0 or 1); the bodies and contents from the front. The connection decodes the vectors'
dictionary (48879) and takes frames of 64 KiB.

Checked besides the bounds: at most ``MAX_PUSHED_DICTS`` dictionaries are installed on the
connection, and every answer it sends is a DICT_ACK frame.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cache

from iac.errors import IacError
from iac.transport.base import TransportConfig
from iac.transport.session import MAX_PUSHED_DICTS, DictState
from iac.wire._pb.iac_pb2 import Dict, Hello
from iac.wire.dicts import Dictionary, DictionarySet
from iac.wire.frames import FrameType, decode_frame
from iac.wire.identity import Identity
from tests.fuzz.bounds import Finding, check_error
from tests.fuzz.common import MAX_FRAME, VECTORS, FuzzedDataProvider, Layout

RAW_DICT, DICT, RAW_ACK, PUSH_ACK = range(4)
U32 = (1 << 32) - 1


@dataclass(frozen=True)
class Op:
    kind: int
    flag: bool = False  # DICT: the content's own id; PUSH_ACK: the pushed dictionary's id
    number: int = 0  # the fuzzed id
    data: bytes = b""  # the body, the content, or the peer's key seed


@dataclass(frozen=True)
class Plan:
    ops: tuple[Op, ...]
    disabled: bool = False  # the connection neither pushes nor acknowledges dictionaries


def parse(data: bytes) -> Plan:
    fdp = FuzzedDataProvider(data)
    ops = []
    for _ in range(fdp.ConsumeIntInRange(1, 4)):
        kind = fdp.ConsumeIntInRange(0, 3)
        if kind in (DICT, PUSH_ACK):
            flag = fdp.ConsumeIntInRange(0, 1) == 1
            number = fdp.ConsumeIntInRange(0, U32)
        else:
            flag, number = False, 0
        size = 32 if kind == PUSH_ACK else fdp.ConsumeIntInRange(0, 65535)
        ops.append(Op(kind, flag, number, fdp.ConsumeBytes(size)))
    return Plan(tuple(ops), fdp.ConsumeIntInRange(0, 1) == 1)


def layout(plan: Plan) -> bytes:
    out = Layout().int(len(plan.ops), 1, 4)
    for op in plan.ops:
        out.int(op.kind, 0, 3)
        if op.kind in (DICT, PUSH_ACK):
            out.int(int(op.flag), 0, 1).int(op.number, 0, U32)
        if op.kind != PUSH_ACK:
            out.int(len(op.data), 0, 65535)
        out.bytes(op.data)
    return out.int(int(plan.disabled), 0, 1).build()


@cache
def vector_dictionary() -> Dictionary:
    return Dictionary((VECTORS / "dict-48879.zdict").read_bytes())


@cache
def config(push: bool = True) -> TransportConfig:
    return TransportConfig(
        dictionaries=DictionarySet([vector_dictionary()]), max_frame_size=MAX_FRAME, push_dictionaries=push
    )


@cache
def local() -> Identity:
    return Identity.from_seed(b"\x11" * 32)


def _body(op: Op, state: DictState) -> tuple[bytes, bool]:
    """The frame body of ``op`` and whether it is a DICT_ACK."""
    if op.kind in (RAW_DICT, RAW_ACK):
        return op.data, op.kind == RAW_ACK
    if op.kind == DICT:
        own = int.from_bytes(op.data[4:8], "little") if op.flag else op.number
        msg = Dict(dict_id=own, sha256=hashlib.sha256(op.data).digest(), content=op.data)
        return msg.SerializeToString(), False
    seed = op.data.ljust(32, b"\0")
    peer = Hello(agent_id=Identity.from_seed(seed).agent_id, dict_ids=[vector_dictionary().dict_id])
    state.push_frame(local().agent_id, peer)
    pushed = state.pushed
    if pushed is None:
        if state.enabled:
            raise Finding("no dictionary pushed to a peer that shares one")
        return Dict(dict_id=op.number).SerializeToString(), True
    ack = Dict(dict_id=pushed.dict_id if op.flag else op.number, sha256=pushed.sha256)
    return ack.SerializeToString(), True


def TestOneInput(data: bytes) -> None:
    plan = parse(data)
    sent: list[bytes] = []
    state = DictState(config(not plan.disabled), send_control=sent.append)
    for op in plan.ops:
        body, is_ack = _body(op, state)
        try:
            if is_ack:
                state.on_ack(body)
            else:
                state.on_dict(body)
        except IacError as exc:
            check_error(exc)
            return  # a refused push closes the connection
        if len(state.installed) > MAX_PUSHED_DICTS:
            raise Finding(f"{len(state.installed)} dictionaries installed on one connection")
    for frame in sent:
        if decode_frame(frame, max_frame_size=MAX_FRAME).type is not FrameType.DICT_ACK:
            raise Finding("the connection answered a DICT with something else than DICT_ACK")


def seeds() -> dict[str, bytes]:
    """The vectors' dictionary pushed as it is and under a new id, twice, three times; a
    dictionary pushed to this side and acknowledged; and malformed bodies."""
    content = vector_dictionary().content

    def renamed(dict_id: int) -> bytes:
        return content[:4] + dict_id.to_bytes(4, "little") + content[8:]

    def push(dict_id: int) -> Op:
        return Op(DICT, True, 0, renamed(dict_id))

    return {
        "dict-known": layout(Plan((push(vector_dictionary().dict_id),))),
        "dict-new-id": layout(Plan((push(70001),))),
        "dict-three": layout(Plan((push(70001), push(70002), push(70003)))),
        "dict-id-mismatch": layout(Plan((Op(DICT, False, 70009, renamed(70001)),))),
        "dict-not-a-dictionary": layout(Plan((Op(DICT, False, 5, b"not a zstd dictionary"),))),
        "push-and-ack": layout(Plan((Op(PUSH_ACK, True, 0, b"\x22" * 32),))),
        "push-and-wrong-ack": layout(Plan((Op(PUSH_ACK, False, 7, b"\x22" * 32),))),
        "raw-garbage": layout(
            Plan((Op(RAW_DICT, data=b"\x0a\xff\xff\xff\xff\x0f"), Op(RAW_ACK, data=b"\x08")))
        ),
    }
