"""The cases made from the test vectors: the 62 live negatives (each with the close code or ERROR
its row in section 8 demands) and the 7 ``accept`` vectors (taken, judged, the connection goes
on). Their frames are the bytes of ``v1.json``, read by :mod:`iac.conformance.vectors`."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

from iac.conformance.cases import closed_with
from iac.conformance.peer import Closed, NoAnswer, Peer
from iac.conformance.target import CASES, Case, Outcome, Target, check, describe, error_code
from iac.conformance.vectors import LiveVector, live_accepts, live_negatives
from iac.wire._pb.iac_pb2 import Dict, Message
from iac.wire.enums import MessageType
from iac.wire.frames import FrameType, encode_frame

# --- the negative vectors -----------------------------------------------------------------------


async def push_dictionary(t: Target, peer: Peer, content: bytes, *, control: bool = True) -> str:
    """Push ``content`` (DICT, section 5) and wait for its DICT_ACK: "" once installed, else why
    the vector that needs it does not apply (a node MAY ignore DICT). ``control=False``: on a new
    unidirectional stream (QUIC)."""
    dict_id = int.from_bytes(content[4:8], "little")
    body = Dict(dict_id=dict_id, sha256=hashlib.sha256(content).digest(), content=content)
    await peer.send_raw(
        encode_frame(FrameType.DICT, body.SerializeToString(deterministic=True)), control=control
    )
    try:
        while True:
            got = await peer.frame(time.monotonic() + min(t.timeout / 2, 2.0))
            if isinstance(got, Closed):
                return f"not applicable: the node closed on the vector's dictionary ({got.describe()})"
            if got.type is FrameType.DICT_ACK and Dict.FromString(got.body).dict_id == dict_id:
                return ""
    except NoAnswer:
        return f"not applicable: the node did not acknowledge dictionary {dict_id} (section 5, Off)"


def _vector_case(v: LiveVector) -> Case:
    async def run(t: Target) -> Outcome:
        peer = await t.session(v.signer)
        if v.dictionary is not None:
            pushed = await push_dictionary(t, peer, v.dictionary)
            if pushed:
                return Outcome(True, "the vector's dictionary installed first", pushed)
        await peer.send_raw(v.frame)
        if v.truncated:
            peer.link.end_sending()
        if v.close_code is None:
            got = await peer.message(t.deadline(), lambda m: int(m.msg_type) == MessageType.ERROR)
            first = f"ERROR {error_code(got)}" if isinstance(got, Message) else got.describe()
            _, after = await peer.request(t.to, MessageType.PING, t.deadline())
            tail = (
                "; the connection goes on"
                if isinstance(after, Message) and int(after.msg_type) == MessageType.REPLY
                else f"; then {describe(after)}"
            )
            return check("ERROR bad_signature; the connection goes on", first + tail)
        return await closed_with(t, peer, v.close_code, plain_end_ok=v.truncated and t.transport == "tls")

    return Case(f"vector.{v.name}", v.section, v.quote, run)


def _accept_case(v: LiveVector) -> Case:
    async def run(t: Target) -> Outcome:
        peer = await t.session(v.signer)
        if v.dictionary is not None:
            pushed = await push_dictionary(t, peer, v.dictionary)
            if pushed:
                return Outcome(True, "the vector's dictionary installed first", pushed)
        await peer.send_raw(v.frame)
        ping = peer.build(t.to, MessageType.PING, deadline_s=t.timeout)
        await peer.send_message(ping)
        errors: list[str] = []
        replied = False
        while not replied or (v.answered and not errors):
            got = await peer.message(
                t.deadline(), lambda m: int(m.msg_type) in (MessageType.ERROR, MessageType.REPLY)
            )
            if isinstance(got, Closed):
                return Outcome(False, "the frame accepted: the connection goes on", got.describe())
            if int(got.msg_type) == MessageType.ERROR and got.reply_to != ping.msg_id:
                errors.append(error_code(got))
            elif got.reply_to == ping.msg_id:
                replied = True
        ok = all(e in ("policy_denied", "bad_request") for e in errors)
        want = (
            "ERROR policy_denied or bad_request (opened, then judged: another agent's, old)"
            if v.answered
            else ("no ERROR (ACK_REQUESTED and old: dropped unanswered)")
        )
        seen = ", ".join(f"ERROR {e}" for e in errors) or "no ERROR"
        return Outcome(ok, want + "; the connection goes on", seen + "; the connection goes on")

    return Case(f"accept.{v.name}", v.section, v.quote, run)


def _dict_unidirectional_case(content: bytes) -> Case:
    """DICT on a unidirectional stream is taken as on the control stream (section 7)."""

    async def run(t: Target) -> Outcome:
        peer = await t.session()
        on_uni = await push_dictionary(t, peer, content, control=False)
        want = "DICT_ACK for a DICT on a unidirectional stream; the connection goes on"
        if on_uni:
            other = await t.session()
            on_control = await push_dictionary(t, other, content, control=True)
            if not on_control:
                return Outcome(
                    False, want, "no DICT_ACK on a unidirectional stream; one on the control stream"
                )
            return Outcome(True, want, f"{on_uni} on either stream")
        _, got = await peer.request(t.to, MessageType.PING, t.deadline())
        served = isinstance(got, Message) and int(got.msg_type) == MessageType.REPLY
        return Outcome(served, want, want if served else f"DICT_ACK; then {describe(got)}")

    return Case(
        "quic.dict_unidirectional",
        "7 QUIC versions, streams and parameters",
        "a receiver MUST take MESSAGE, FORWARD, DICT, DICT_ACK and GOAWAY on the control stream and on "
        "any unidirectional stream alike",
        run,
        ("quic",),
    )


def all_cases(vectors: Path | None = None) -> list[Case]:
    """The fixed cases, then one per live negative and accept vector of ``vectors`` (default: the
    checkout's), and the QUIC case that pushes the vectors' dictionary on a unidirectional stream."""
    negatives = live_negatives(vectors)
    dictionary = next((v.dictionary for v in negatives if v.dictionary is not None), None)
    return [
        *CASES,
        *(_vector_case(v) for v in negatives),
        *(_accept_case(v) for v in live_accepts(vectors)),
        *([_dict_unidirectional_case(dictionary)] if dictionary is not None else []),
    ]


__all__ = ["all_cases", "push_dictionary"]
