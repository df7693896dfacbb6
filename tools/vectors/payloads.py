"""Write proto/testvectors/payloads-v1.json: the JSON payloads a real node writes.

    .venv/bin/python -m tools.make_payload_vectors

The vectors are not built by hand: :func:`payload_test_vectors` starts a real
:class:`~iac.node.node.Node` on a UNIX socket with a frozen wall clock
(:mod:`tools.vectors.payload_harness`), drives it from a hand-written peer, and records what
the node wrote on the wire (``writer: "node"``) next to the requests that made it write them
(``writer: "peer"``, built with the library's own builders:
:func:`~tools.vectors.payload_schemas.command_payload`,
:func:`iac.mesh.service.publish_request` …). Every payload is checked against
:data:`~tools.vectors.payload_schemas.SCHEMAS` as it is recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

from tools.vectors import render, write
from tools.vectors.payload_harness import (
    DEADLINE_US,
    PEER_SESSION,
    VECTOR_TIME_US,
    Recorder,
    quiet,
    vector_node,
)
from tools.vectors.payload_schemas import (
    KIND_ACK,
    KIND_APP,
    KIND_CANCEL,
    KIND_COMMAND,
    KIND_CREDIT,
    KIND_END,
    KIND_ERROR,
    KIND_REGISTRY_REPLY,
    KIND_REGISTRY_REQUEST,
    KIND_REPLY,
    command_payload,
    dumps_payload,
)

PAYLOAD_VECTORS_VERSION = 1
_HOUR_US = 3_600_000_000


async def _generate() -> dict[str, Any]:
    from iac.errors import HandlerError
    from iac.mesh.service import (
        lookup_request,
        publish_request,
        revoke_request,
        rotate_request,
        serve_registry,
    )
    from iac.protocol.records import AgentRecord, key_digest, sign_record, sign_revocation, sign_rotation
    from iac.wire._pb.iac_pb2 import MessageType
    from iac.wire.message import FLAG_ACK_REQUESTED, FLAG_STREAM

    rec = Recorder()
    async with vector_node() as (node, peer, ids):
        started = asyncio.Event()

        def add(a: int, b: int) -> int:
            return a + b

        def summarize(text: str, max_words: int = 3) -> dict[str, Any]:
            words = text.split()
            return {"summary": " ".join(words[:max_words]), "words": len(words)}

        def version() -> str:
            return "iac/1"

        def deny() -> None:
            raise HandlerError("unauthorized", "only the owner may call deny")

        def fail() -> None:
            raise RuntimeError("secret detail that is never sent")

        async def slow() -> None:
            started.set()
            await asyncio.sleep(30)

        for func in (add, summarize, version, deny, fail, slow):
            node.expose(func)
        node.on(MessageType.RUN)(lambda ctx: None)

        @node.on(MessageType.TERMINATE)
        async def parts(ctx: Any) -> Any:  # a streaming handler: each yielded value is a REPLY part
            for i in range(2):
                yield {"part": i}
            if ctx.payload.get("fail"):
                raise HandlerError("bad_request", "the second part was the last one available")

        C, R = MessageType.COMMAND, MessageType.REGISTER_KEY

        async def call(
            name: str,
            desc: str,
            payload: Any,
            answer_kind: str,
            answer_desc: str,
            msg_type: int = C,
            **kw: Any,
        ) -> None:
            req, ans = await peer.request(msg_type, payload, **kw)
            req_kind = KIND_COMMAND if msg_type == C else KIND_REGISTRY_REQUEST if msg_type == R else KIND_APP
            rec.add(name, desc, req_kind, "peer", req)
            ans_kind = answer_kind
            rec.add(
                f"{name}/{'reply' if ans.msg_type == MessageType.REPLY else ans_kind}",
                answer_desc,
                ans_kind,
                "node",
                ans,
            )

        with quiet("iac.node"):
            # --- remote calls: COMMAND → REPLY / ERROR
            await call(
                "call-add",
                "remote call add(2, 3)",
                command_payload("add", [2, 3]),
                KIND_REPLY,
                "the result, a bare JSON number",
            )
            await call(
                "call-kwargs",
                "keyword arguments and non-ASCII text",
                command_payload("summarize", ["Grüße aus Zürich, schöne Grüße"], {"max_words": 2}),
                KIND_REPLY,
                "an object result; UTF-8 is written unescaped",
            )
            await call(
                "call-name-only",
                "args and kwargs left out (both optional)",
                {"name": "version"},
                KIND_REPLY,
                "a string result",
            )
            await call(
                "call-not-exposed",
                "a name the node did not expose",
                command_payload("nope"),
                KIND_ERROR,
                "no_handler: nothing is looked up beyond the allow-list",
            )
            await call(
                "call-bad-arguments",
                "add(1): a missing argument",
                command_payload("add", [1]),
                KIND_ERROR,
                "bad_request, checked against the function's signature",
            )
            await call(
                "call-unknown-key",
                "a COMMAND with a key beside name, args, kwargs",
                {"name": "add", "args": [1, 2], "env": {}},
                KIND_ERROR,
                "bad_request from the schema check (pipeline refusal)",
            )
            await call(
                "call-handler-error",
                "the function raises HandlerError('unauthorized', ...)",
                command_payload("deny"),
                KIND_ERROR,
                "the code and text the handler chose",
            )
            await call(
                "call-internal",
                "the function raises RuntimeError",
                command_payload("fail"),
                KIND_ERROR,
                "internal; the exception's text is not sent",
            )
            await call(
                "call-timeout",
                "a call whose deadline is 50 ms away; the function sleeps",
                command_payload("slow"),
                KIND_ERROR,
                "timeout: the handler was cut off",
                deadline_us=VECTOR_TIME_US + 50_000,
            )
            await call(
                "request-no-handler",
                "a CREATE request, no handler registered",
                None,
                KIND_ERROR,
                "no_handler for a msg_type",
                msg_type=MessageType.CREATE,
            )

            # --- CANCEL from the caller: the running handler ends, answered with ERROR cancelled
            started.clear()
            req = await peer.send(C, dumps_payload(command_payload("slow")), deadline_us=DEADLINE_US)
            await asyncio.wait_for(started.wait(), 10)
            cancel = await peer.send(MessageType.CANCEL, reply_to=req.msg_id, reply_session_id=req.session_id)
            ans = await peer.receive(
                lambda m: m.reply_to == req.msg_id and m.reply_session_id == PEER_SESSION
            )
            rec.add("call-cancelled", "a call of a slow function", KIND_COMMAND, "peer", req)
            rec.add("call-cancelled/cancel", "the caller cancels it", KIND_CANCEL, "peer", cancel)
            rec.add(
                "call-cancelled/error",
                "cancelled, answering the COMMAND (not the CANCEL)",
                KIND_ERROR,
                "node",
                ans,
            )

            # --- ACK of a one-way ACK_REQUESTED message
            one_way = await peer.send(MessageType.RUN, dumps_payload({"job": 7}), flags=FLAG_ACK_REQUESTED)
            ack = await peer.receive(
                lambda m: m.reply_to == one_way.msg_id and m.reply_session_id == PEER_SESSION
            )
            rec.add(
                "send-acked",
                "a one-way RUN with ACK_REQUESTED (its payload is the application's)",
                KIND_APP,
                "peer",
                one_way,
            )
            rec.add("send-acked/ack", "ACK once the handler finished: empty payload", KIND_ACK, "node", ack)

            # --- a streamed reply: STREAM request with credit 1, a part, CREDIT 3, a part, END
            T = MessageType.TERMINATE
            wanted = {"deadline_us": DEADLINE_US, "flags": FLAG_STREAM}
            req = await peer.send(T, dumps_payload({"fail": False}), credit=1, **wanted)

            def about(m: Any) -> bool:  # answers the latest stream request
                return bool(m.reply_to == req.msg_id and m.reply_session_id == PEER_SESSION)

            first = await peer.receive(lambda m: about(m) and m.stream_seq == 1)
            credit = await peer.send(MessageType.CREDIT, reply_to=req.msg_id, reply_session_id=req.session_id,
                                     credit=3)  # fmt: skip
            second = await peer.receive(lambda m: about(m) and m.stream_seq == 2)
            end = await peer.receive(lambda m: about(m) and m.stream_seq == 3)
            rec.add("stream", "a request for a streamed reply, credit for one part", KIND_APP, "peer", req)
            rec.add("stream/part-1", "the first part (stream_seq 1, flags STREAM)", KIND_REPLY, "node", first)
            rec.add("stream/credit", "the consumer grants three parts in all", KIND_CREDIT, "peer", credit)
            rec.add("stream/part-2", "the second part", KIND_REPLY, "node", second)
            rec.add("stream/end", "END: stream_seq 3, flags STREAM|END, empty payload", KIND_END, "node", end)
            req = await peer.send(T, dumps_payload({"fail": True}), credit=4, **wanted)
            failed = await peer.receive(lambda m: about(m) and m.stream_seq == 3)
            rec.add("stream-error", "a stream whose handler fails after two parts", KIND_APP, "peer", req)
            rec.add(
                "stream-error/error", "ERROR in the place of END (stream_seq 3)", KIND_ERROR, "node", failed
            )

            # --- the node's own COMMAND and CANCEL (Node.invoke, then the caller gives up)
            task = asyncio.ensure_future(
                node.invoke(peer.identity.agent_id, "translate", ["Grüße"], {"to": "en"}, timeout=30)
            )
            cmd = await peer.receive(lambda m: m.msg_type == C)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            node_cancel = await peer.receive(lambda m: m.msg_type == MessageType.CANCEL)
            rec.add(
                "node-invoke",
                "Node.invoke(peer, 'translate', ['Grüße'], {'to': 'en'})",
                KIND_COMMAND,
                "node",
                cmd,
            )
            rec.add(
                "node-invoke/cancel",
                "the caller's task was cancelled: the node sends CANCEL",
                KIND_CANCEL,
                "node",
                node_cancel,
            )

            # --- REGISTER_KEY: not a registry, then the registry role
            peer_id, succ = ids["peer"], ids["successor"]
            await call(
                "registry-not-serving",
                "a status request to a node without the registry role",
                {"op": "status", "agent_id": peer_id.agent_id},
                KIND_ERROR,
                "no_handler: nothing handles REGISTER_KEY",
                msg_type=R,
            )
            serve_registry(node, "memory")
            record = AgentRecord(
                peer_id.agent_id,
                1,
                VECTOR_TIME_US + _HOUR_US,
                ("summarizer",),
                ("tls://192.0.2.10:4434",),
                ("summarize",),
                key_digest(succ.agent_id),
            )
            signed = sign_record(peer_id, record)
            rq = KIND_REGISTRY_REPLY
            await call(
                "registry-publish",
                "publish the peer's record (committed to its successor)",
                publish_request(signed),
                rq,
                "the stored seq and expiry",
                msg_type=R,
            )
            await call(
                "registry-lookup-alias",
                "lookup by alias",
                lookup_request(alias="summarizer"),
                rq,
                "one entry: the signed record as stored, no rotations",
                msg_type=R,
            )
            await call(
                "registry-lookup-capability",
                "lookup by capability with a limit",
                lookup_request(capability="summarize", limit=5),
                rq,
                "entries sorted by AgentId",
                msg_type=R,
            )
            await call(
                "registry-lookup-unknown",
                "lookup of an unregistered AgentId",
                lookup_request(agent_id=succ.agent_id),
                rq,
                "no entries",
                msg_type=R,
            )
            await call(
                "registry-status-active",
                "status of the peer",
                {"op": "status", "agent_id": peer_id.agent_id},
                rq,
                "active",
                msg_type=R,
            )
            await call(
                "registry-publish-stale",
                "the same seq published again",
                publish_request(signed),
                KIND_ERROR,
                "bad_request naming stale_seq",
                msg_type=R,
            )
            rot = sign_rotation(peer_id, succ, seq=2, issued_us=VECTOR_TIME_US)
            await call(
                "registry-rotate",
                "the peer rotates to its committed successor",
                rotate_request(rot),
                rq,
                "old and new AgentId",
                msg_type=R,
            )
            await call(
                "registry-lookup-rotated",
                "lookup of the successor",
                lookup_request(agent_id=succ.agent_id),
                rq,
                "the predecessor's record plus the rotation as proof",
                msg_type=R,
            )
            await call(
                "registry-status-rotating",
                "status of the old key",
                {"op": "status", "agent_id": peer_id.agent_id},
                rq,
                "rotating (in its grace period), with the successor",
                msg_type=R,
            )
            rev = sign_revocation(succ, seq=3, issued_us=VECTOR_TIME_US, reason="retired")
            await call(
                "registry-revoke",
                "the successor revokes itself (sent by the peer: any sender)",
                revoke_request(rev),
                rq,
                "the revoked AgentId and seq",
                msg_type=R,
            )
            await call(
                "registry-status-revoked",
                "status of the revoked key",
                {"op": "status", "agent_id": succ.agent_id},
                rq,
                "revoked",
                msg_type=R,
            )

    agents = {role: {"seed_hex": i.seed().hex(), "agent_id": i.agent_id} for role, i in ids.items()}
    return {
        "version": PAYLOAD_VECTORS_VERSION,
        "description": (
            "payload_json of COMMAND, REPLY, ERROR, ACK, CANCEL and REGISTER_KEY as an IAC node writes "
            "them (writer 'node', recorded from a real node) and the requests that made it write them "
            "(writer 'peer'). 'about' names the vector whose (session_id, msg_id) an answer or CANCEL "
            "carries in (reply_session_id, reply_to). See docs/PROTOCOL.md, 'Payload schemas and their "
            "vectors'."
        ),
        "time_us": VECTOR_TIME_US,
        "agents": agents,
        "vectors": rec.vectors,
    }


def payload_test_vectors() -> dict[str, Any]:
    """The content of ``proto/testvectors/payloads-v1.json`` (runs a node on a UNIX socket)."""
    return asyncio.run(asyncio.wait_for(_generate(), 60))


def render_payload_vectors() -> str:
    """:func:`payload_test_vectors` as the exact text of the committed file."""
    return render(payload_test_vectors())


def write_payload_vectors(path: str | Path) -> None:
    """Rewrite the vector file (``python -m tools.make_payload_vectors``)."""
    write(path, render_payload_vectors())


__all__ = [
    "payload_test_vectors",
    "render_payload_vectors",
    "write_payload_vectors",
]
