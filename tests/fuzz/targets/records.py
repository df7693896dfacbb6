"""Registry payloads: signed agent records, rotation and revocation statements, and their envelopes.

Input: from the end, the kind (0: record, 1: rotation, 2: revocation, 3: an envelope) and, for a
rotation, the commitment it is checked against (0: none, 1: the vector's, 2: another); then from
the front the signatures (64 bytes each; two for a rotation) and the canonical payload bytes.
An envelope input is JSON text instead, and a further integer (0-2) says which envelope it is; text
that is not JSON never reaches the library (a node parses the JSON of a payload before it reads an
envelope from it). Everything is opened at the vectors' time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from iac.protocol.canonical import canonical_json
from iac.protocol.records import (
    MAX_ADDRESSES,
    MAX_ALIASES,
    MAX_CAPABILITIES,
    AgentRecord,
    SignedRecord,
    open_record,
    sign_record,
)
from iac.protocol.statements import (
    MAX_REASON_LEN,
    SignedRevocation,
    SignedRotation,
    open_revocation,
    open_rotation,
)
from iac.wire.identity import Domain, Identity
from tests.fuzz.common import FuzzedDataProvider, Layout, vectors

RECORD, ROTATION, REVOCATION, ENVELOPE = range(4)
NO_COMMITMENT, VECTOR_COMMITMENT, OTHER_COMMITMENT = range(3)


@dataclass(frozen=True)
class Plan:
    kind: int
    choice: int  # the commitment (rotation) or the envelope's kind (envelope)
    signatures: tuple[bytes, ...]
    data: bytes


def parse(data: bytes) -> Plan:
    fdp = FuzzedDataProvider(data)
    kind = fdp.ConsumeIntInRange(0, 3)
    choice = fdp.ConsumeIntInRange(0, 2) if kind in (ROTATION, ENVELOPE) else 0
    n = {RECORD: 1, ROTATION: 2, REVOCATION: 1, ENVELOPE: 0}[kind]
    signatures = tuple(fdp.ConsumeBytes(64) for _ in range(n))
    return Plan(kind, choice, signatures, fdp.ConsumeBytes(fdp.remaining_bytes()))


def layout(plan: Plan) -> bytes:
    out = Layout().int(plan.kind, 0, 3)
    if plan.kind in (ROTATION, ENVELOPE):
        out.int(plan.choice, 0, 2)
    for sig in plan.signatures:
        out.bytes(sig)
    return out.bytes(plan.data).build()


def _commitment(choice: int) -> str | None:
    if choice == NO_COMMITMENT:
        return None
    if choice == VECTOR_COMMITMENT:
        return str(vectors("records-v1")["rotations"][0]["next_key_digest"])
    return "0" * 64


def TestOneInput(data: bytes) -> None:
    plan = parse(data)
    now = vectors("records-v1")["now_us"]
    if plan.kind == RECORD:
        open_record(plan.data, plan.signatures[0], now)
    elif plan.kind == ROTATION:
        signed = SignedRotation(plan.data, *plan.signatures)
        open_rotation(signed, now, next_key_digest=_commitment(plan.choice))
    elif plan.kind == REVOCATION:
        open_revocation(SignedRevocation(plan.data, plan.signatures[0]), now)
    else:
        try:
            obj = json.loads(plan.data)
        except (ValueError, RecursionError):
            return
        if plan.choice == RECORD:
            record = SignedRecord.from_json_obj(obj)
            open_record(record.data, record.signature, now)
        elif plan.choice == ROTATION:
            open_rotation(SignedRotation.from_json_obj(obj), now, next_key_digest=None)
        else:
            open_revocation(SignedRevocation.from_json_obj(obj), now)


def _at_the_limits() -> dict[str, bytes]:
    """A signed record with as many aliases, addresses and capabilities as a record may hold, the
    same with one more of each (its canonical bytes, since a record refuses to be built so), and a
    revocation with the longest reason and one character more."""
    vec = vectors("records-v1")
    ident = Identity.from_seed(bytes.fromhex(vec["records"][0]["seed_hex"]))
    now = vec["now_us"]
    fields = {
        "aliases": [f"a{i:02d}" for i in range(MAX_ALIASES)],
        "addresses": [f"quic://h{i}.example:4433" for i in range(MAX_ADDRESSES)],
        "capabilities": [f"c{i:02d}" for i in range(MAX_CAPABILITIES)],
    }
    out: dict[str, bytes] = {}
    full = sign_record(ident, AgentRecord(ident.agent_id, 1, now + 3_600_000_000, **fields))
    out["record-full-lists"] = layout(Plan(RECORD, 0, (full.signature,), full.data))
    for key, values in fields.items():
        over = {**json.loads(full.data), key: sorted([*values, f"{values[-1]}9"])}
        out[f"record-one-{key}-too-many"] = layout(Plan(RECORD, 0, (full.signature,), canonical_json(over)))
    for n in (MAX_REASON_LEN, MAX_REASON_LEN + 1):
        statement = {"agent_id": ident.agent_id, "issued_us": now, "reason": "r" * n, "seq": 1}
        data = canonical_json(statement)
        out[f"revocation-reason-{n}"] = layout(Plan(REVOCATION, 0, (ident.sign(Domain.REVOKE, data),), data))
    return out


def seeds() -> dict[str, bytes]:
    """Every record, rotation and revocation vector, good and bad, as bytes and as envelopes; and
    payloads at their limits."""
    vec = vectors("records-v1")
    out: dict[str, bytes] = _at_the_limits()
    for rec in vec["records"]:
        sig = bytes.fromhex(rec["signature_hex"])
        out[f"record-{rec['name']}"] = layout(Plan(RECORD, 0, (sig,), rec["canonical"].encode()))
        out[f"record-{rec['name']}-envelope"] = layout(Plan(ENVELOPE, RECORD, (), rec["envelope"].encode()))
    for rot in vec["rotations"]:
        sigs = (bytes.fromhex(rot["old_signature_hex"]), bytes.fromhex(rot["new_signature_hex"]))
        for choice in (NO_COMMITMENT, VECTOR_COMMITMENT):
            name = f"rotation-{rot['name']}-{choice}"
            out[name] = layout(Plan(ROTATION, choice, sigs, rot["canonical"].encode()))
        out[f"rotation-{rot['name']}-envelope"] = layout(
            Plan(ENVELOPE, ROTATION, (), rot["envelope"].encode())
        )
    for rev in vec["revocations"]:
        sig = bytes.fromhex(rev["signature_hex"])
        out[f"revocation-{rev['name']}"] = layout(Plan(REVOCATION, 0, (sig,), rev["canonical"].encode()))
        out[f"revocation-{rev['name']}-envelope"] = layout(
            Plan(ENVELOPE, REVOCATION, (), rev["envelope"].encode())
        )
    for neg in vec["negative"]:
        data = neg["data"].encode("utf-8")
        if neg["kind"] == "rotation":
            sigs = (bytes.fromhex(neg["old_signature_hex"]), bytes.fromhex(neg["new_signature_hex"]))
            digest = neg["next_key_digest"]
            choice = (
                NO_COMMITMENT
                if digest is None
                else VECTOR_COMMITMENT
                if digest == _commitment(VECTOR_COMMITMENT)
                else OTHER_COMMITMENT
            )
            out[neg["name"]] = layout(Plan(ROTATION, choice, sigs, data))
        else:
            kind = RECORD if neg["kind"] == "record" else REVOCATION
            out[neg["name"]] = layout(Plan(kind, 0, (bytes.fromhex(neg["signature_hex"]),), data))
    return out
