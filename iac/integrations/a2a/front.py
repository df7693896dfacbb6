"""The ASGI layer of the A2A gateway, before a2a-sdk's JSON-RPC routes: it authenticates each
POST, reads its body within the bounds (per request, per client address and in total), answers a
repeated ``messageId`` from the first answer, takes the principal's fair share of the calls toward
the agent (HTTP 429 when none frees within ``queue_wait``), and counts every outcome
(:class:`GatewayStats`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.authentication import AuthCredentials, SimpleUser
from starlette.requests import ClientDisconnect

from iac.integrations.a2a.binding import GET_AGENT_CARD, METHODS, error_name
from iac.integrations.a2a.tenants import Throttled

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

log = logging.getLogger("iac.integrations")

SCOPE_KEY = "iac.gateway"
_INSPECT = 64 * 1024  # bytes of a JSON response read back to count its error code
#: The methods that carry a message (whose ``messageId`` a repeat is known by): A2A 1.0 and 0.3.
_SENDS = ("SendMessage", "SendStreamingMessage", "message/send", "message/stream")
#: A2A 0.3's JSON-RPC methods (the gateway serves them through a2a-sdk's 0.3 compatibility).
_V03_METHODS = frozenset({
    "message/send", "message/stream", "tasks/get", "tasks/cancel", "tasks/resubscribe",
    "tasks/pushNotificationConfig/set", "tasks/pushNotificationConfig/get",
    "tasks/pushNotificationConfig/list", "tasks/pushNotificationConfig/delete",
    "agent/getAuthenticatedExtendedCard",
})  # fmt: skip


class GatewayStats:
    """``requests``: JSON-RPC POSTs; ``refused``: answered at the gateway, never forwarded (by
    reason: ``unauthenticated``, ``too_large``, ``throttled`` (HTTP 429: no call slot within
    ``queue_wait``), ``bodies_per_client``/``bodies_total``, ``client_left`` and the JSON-RPC
    errors); ``answered_errors``: A2A errors of forwarded calls (by JSON-RPC error name);
    ``replayed``: repeated ``messageId`` answered from the first answer; plus the forwarding
    handler's and the IAC client side's counters."""

    def __init__(self) -> None:
        self.requests = 0
        self.replayed = 0
        self.refused: Counter[str] = Counter()
        self.answered_errors: Counter[str] = Counter()


class Front:
    """The ASGI layer before a2a-sdk's routes: authentication, the body read within its bounds,
    a repeated ``messageId`` answered from the first answer, the principal's fair share of the
    calls toward the agent, counting."""

    def __init__(self, app: ASGIApp, gateway: Any) -> None:
        """``gateway``: the :class:`~iac.integrations.a2a.gateway.A2AGateway` it fronts (its
        auth, bounds, budgets, shares and counters)."""
        self.app = app
        self.gw = gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != "/":
            await self.app(scope, receive, send)
            return
        gw, stats = self.gw, self.gw.stats_
        stats.requests += 1
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
        principal = gw.auth.authenticate(headers)
        if principal is None:
            stats.refused["unauthenticated"] += 1
            await _reply(send, 401, "authentication required", {"www-authenticate": gw.auth.challenge()})
            return
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > gw.max_body:
            stats.refused["too_large"] += 1
            await _reply(send, 413, f"the body is over {gw.max_body} bytes")
            return
        client = str((scope.get("client") or ("",))[0])
        held = [0]
        try:
            version = headers.get("a2a-version", "").strip()
            await self._read_and_serve(scope, receive, send, principal, client, declared, held, version)
        except asyncio.CancelledError:
            if not gw.closing:
                raise
            log.debug("gateway: a call of %s ended by the gateway's shutdown", principal)
        finally:
            gw.bodies.give(client, held[0])

    async def _read_and_serve(
        self, scope: Scope, receive: Receive, send: Send, principal: str, client: str, declared: str,
        held: list[int], version: str = "",
    ) -> None:  # fmt: skip
        gw, stats = self.gw, self.gw.stats_

        async def hold(size: int) -> bool:
            refused = gw.bodies.take(client, size)
            if refused is None:
                held[0] += size
                return True
            stats.refused[f"bodies_{refused}"] += 1
            bound = gw.limits.max_bodies if refused == "total" else gw.limits.max_bodies_per_client
            text = f"request bodies in flight are over {bound} bytes ({refused}); retry later"
            await _reply(send, 429 if refused == "per_client" else 503, text)
            return False

        if declared.isdigit() and not await hold(int(declared)):
            return
        chunks: list[bytes] = []
        received = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                stats.refused["client_left"] += 1
                log.debug("gateway: %s (%s) left in the middle of its request body", principal, client)
                return
            chunk = message.get("body", b"")
            received += len(chunk)
            if received > gw.max_body:
                stats.refused["too_large"] += 1
                await _reply(send, 413, f"the body is over {gw.max_body} bytes")
                return
            if received > held[0] and not await hold(received - held[0]):
                return
            chunks.append(chunk)
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        request_id, message_id = _ids(body)
        if (text := _wrong_version(version, body)) is not None:
            stats.refused["VersionNotSupportedError"] += 1
            await _reply(send, 200, text, code=-32009, request_id=request_id)
            return
        if message_id is not None:
            entry = gw.replays.begin(principal, message_id, gw.clock())
            if entry is not None:
                await self._replay(send, entry, request_id)
                return
        answer: list[Any] = []
        try:
            try:
                await gw.shares.acquire(principal, gw.limits.queue_wait)
            except Throttled as exc:
                stats.refused["throttled"] += 1
                await _reply(send, 429, str(exc), code=-32000, request_id=request_id,
                             data={"principal": exc.principal, "in_flight": exc.in_flight})  # fmt: skip
                return
            try:
                await self._serve(scope, receive, send, principal, body, answer)
            finally:
                gw.shares.release(principal)
        finally:
            if message_id is not None:
                gw.replays.finish(principal, message_id, answer[0] if answer else None)

    async def _serve(
        self, scope: Scope, receive: Receive, send: Send, principal: str, body: bytes, answer: list[Any]
    ) -> None:
        stats = self.gw.stats_
        record: dict[str, Any] = {"forwarded": False}
        scope = dict(scope)
        scope["user"] = SimpleUser(principal)
        scope["auth"] = AuthCredentials(["authenticated"])
        scope[SCOPE_KEY] = record
        given = False

        async def replayed() -> Message:
            nonlocal given
            if not given:
                given = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # what comes next: the client leaving

        json_body: list[bytes] = []
        is_json = False
        status = 200
        head: list[tuple[bytes, bytes]] = []
        kept: list[bytes] | None = []
        kept_size = 0
        limit = self.gw.limits.replay_bytes

        async def counted(message: Message) -> None:
            nonlocal is_json, status, head, kept, kept_size
            if message["type"] == "http.response.start":
                status, head = int(message["status"]), list(message.get("headers", ()))
                ctype = dict(head).get(b"content-type", b"")
                is_json = ctype.startswith(b"application/json")
            elif message["type"] == "http.response.body":
                chunk = message.get("body", b"")
                kept_size += len(chunk)
                if kept is not None:
                    if kept_size <= limit:
                        kept.append(chunk)
                    else:
                        kept = None  # too large to give again: a repeat is refused, not run
                if is_json:
                    if sum(map(len, json_body)) < _INSPECT:
                        json_body.append(chunk)
                    if not message.get("more_body"):
                        self._count(b"".join(json_body), record)
                if not message.get("more_body") and record["forwarded"]:
                    answer.append((status, head, b"".join(kept) if kept is not None else None))
            await send(message)

        try:
            await self.app(scope, replayed, counted)
        except ClientDisconnect:
            stats.refused["client_left"] += 1
            log.debug("gateway: %s left before its answer was sent", principal)

    async def _replay(self, send: Send, entry: Any, request_id: Any) -> None:
        """Answer a repeated ``messageId`` with the first call's answer (waiting for it)."""
        stats = self.gw.stats_
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.gw.stream_timeout):
                await entry.done.wait()
        got = entry.answer
        if got is None or got[2] is None:
            stats.refused["repeat_unanswerable"] += 1
            await _reply(send, 409, "this messageId was sent before and its answer cannot be given again",
                         request_id=request_id)  # fmt: skip
            return
        status, head, body = got
        stats.replayed += 1
        if dict(head).get(b"content-type", b"").startswith(b"application/json"):
            with contextlib.suppress(ValueError, TypeError):
                doc = json.loads(body)
                doc["id"] = request_id
                body = json.dumps(doc).encode()
        head = [(k, v) for k, v in head if k.lower() != b"content-length"]
        head.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": head})
        await send({"type": "http.response.body", "body": body})

    def _count(self, body: bytes, record: dict[str, Any]) -> None:
        if b'"error"' not in body:
            return
        try:
            code = json.loads(body)["error"]["code"]
        except (ValueError, KeyError, TypeError):
            return
        stats = self.gw.stats_
        if not record["forwarded"]:
            stats.refused[error_name(code)] += 1
        else:
            stats.answered_errors[error_name(code)] += 1


def _ids(body: bytes) -> tuple[Any, str | None]:
    """The JSON-RPC id of a request, and the ``messageId`` of a SendMessage or
    SendStreamingMessage or their A2A 0.3 names (None for other calls, and for a body that is not
    such a request)."""
    if b"messageId" not in body and b"message_id" not in body and b'"id"' not in body:
        return None, None
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return None, None
    if not isinstance(doc, dict):
        return None, None
    request_id = doc.get("id")
    if isinstance(request_id, bool) or not isinstance(request_id, str | int | None):
        request_id = None
    if doc.get("method") not in _SENDS:
        return request_id, None
    params = doc.get("params")
    message = params.get("message") if isinstance(params, dict) else None
    mid = None
    if isinstance(message, dict):
        mid = message.get("messageId", message.get("message_id"))
    if not isinstance(mid, str) or not 0 < len(mid) <= 256:
        return request_id, None
    return request_id, f"{doc['method']} {mid}"


def _wrong_version(version: str, body: bytes) -> str | None:
    """What to tell a request whose method is of another A2A version than its ``A2A-Version``
    header says (none: 0.3), naming the fix; None for any other request (a2a-sdk answers it)."""
    legacy = not version or version.startswith("0.")
    if not legacy and not (
        version.startswith("1") and any(m in body for m in (b'"message/', b'"tasks/', b'"agent/'))
    ):
        return None  # the common case, a 1.0 call: no second parse of the body
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return None
    method = doc.get("method") if isinstance(doc, dict) else None
    if not isinstance(method, str) or len(method) > 64:
        return None
    if legacy and method in METHODS and method != GET_AGENT_CARD:
        return (f"{method!r} is an A2A 1.0 method: send the header 'A2A-Version: 1.0' (a request "
                "without it is A2A 0.3, whose methods are message/send, tasks/get, ...)")  # fmt: skip
    if version.startswith("1") and method in _V03_METHODS:
        return (f"{method!r} is an A2A 0.3 method, sent as A2A {version}: send it without the "
                "A2A-Version header (or with 'A2A-Version: 0.3'), or call its 1.0 name "
                "(SendMessage, GetTask, ...)")  # fmt: skip
    return None


async def _reply(
    send: Send, status: int, text: str, extra: dict[str, str] | None = None, *, code: int = -32600,
    request_id: Any = None, data: dict[str, Any] | None = None,
) -> None:  # fmt: skip
    error: dict[str, Any] = {"code": code, "message": text, **({"data": data} if data else {})}
    body = json.dumps({"jsonrpc": "2.0", "id": request_id, "error": error}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.encode(), v.encode()) for k, v in (extra or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


__all__ = ["SCOPE_KEY", "ASGIApp", "Front", "GatewayStats"]
