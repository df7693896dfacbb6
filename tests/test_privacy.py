"""Objects keep their private members to themselves: outside the one module per transport that
adapts a network library's internals, no code in ``iac/`` reads or writes ``x._name`` where ``x``
is not ``self``, ``cls`` or ``super()``. Each remaining exception is listed below with why."""

from __future__ import annotations

import ast
import functools
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "iac"
GENERATED = PACKAGE / "wire" / "_pb"

#: Modules whose job is to adapt a library's internals (one per transport that needs one).
ADAPTERS = {
    "iac/transport/quic/backend.py": "QUIC: the aioquic and qh3 adapter (the libraries' private state)",
}

#: ``(module, expression)``: why the access stays. A stale entry fails the test too.
ALLOWED = {
    **{
        (f"iac/cli/{name}.py", "argparse._SubParsersAction"): (
            "argparse's subparsers type has no public name; used in annotations only"
        )
        for name in (
            "conformance",
            "demo",
            "dicts",
            "files",
            "keys",
            "mesh",
            "net",
            "node",
            "proto",
            "status",
        )
    },
    **{
        ("iac/conformance/link.py", expr): (
            "the conformance tester drives aioquic's own protocol object as a raw QUIC peer (it "
            "must send what iac's transport never would), reading its timer and peer certificate"
        )
        for expr in (
            "protocol._handle_timer",
            "protocol._timer",
            "qsrv._transport",
            "self._protocol._quic",
            "self._quic.tls._peer_certificate",
            # the version and the transport parameters the peer announced (case quic.parameters)
            "q._version",
            "q._remote_max_idle_timeout",
            "q._remote_max_streams_bidi",
            "q._remote_max_streams_uni",
            "q._remote_max_data",
            # a frame aioquic does not know, written into its next 1-RTT packet (case
            # quic.ack_frequency_bounds)
            "q._write_connection_limits",
        )
    },
    **{
        (module, expr): "aiohttp's TCPSite keeps its server (and so the port it bound) private"
        for module, expr in (("iac/bench/contenders/baselines.py", "site._server"),)
    },
    **{
        (module, expr): "aioquic's QuicServer keeps its UDP transport (and so the port it bound) private"
        for module, expr in (
            ("iac/bench/contenders/floor.py", "qserver._transport"),
            ("iac/bench/scenarios/filetransfer.py", "server._transport"),
            ("iac/bench/scenarios/transport.py", "self.echo_quic._transport"),
        )
    },
    **{
        ("iac/bench/contenders/ccflows.py", expr): (
            "the congestion-control benchmark reports aioquic's congestion window and loss state, "
            "which it keeps private"
        )
        for expr in ("conn._quic", "conn._quic._loss", "conn._quic._loss._cc", "quic._loss", "quic._loss._cc")
    },
    ("iac/bench/contenders/ccflows.py", "os._exit"): (
        "a benchmark endpoint in a network namespace exits at once, without running the loop's cleanup"
    ),
    ("iac/protocol/files/receiver.py", "hashlib._Hash"): (
        "hashlib's hash object type has no public name; used in an annotation only"
    ),
    **{
        ("iac/protocol/record_store.py", f"self._s.{name}"): (
            "the memory record store's transaction, in the store's own module, works on its rows"
        )
        for name in ("_rows", "_aliases", "_caps", "_apply")
    },
    ("iac/stores/records_redis.py", "self._s._client"): (
        "the Redis record store's transaction, in the store's own module, uses its client"
    ),
    **{
        ("iac/transport/quic/congestion/adapter.py", expr): (
            "the congestion controller hooks into aioquic's loss recovery and pacer, which have "
            "no public interface (aioquic only)"
        )
        for expr in ("quic._loss", "recovery._pacer", "self.quic._pacing_at", "self.quic._spaces")
    },
    **{
        ("iac/transport/stream/protocol.py", expr): (
            "asyncio's TLS read buffer is shrunk in place (checked with getattr first, left "
            "alone where asyncio differs)"
        )
        for expr in ("ssl_proto._ssl_buffer", "ssl_proto._ssl_buffer_view")
    },
    ("iac/integrations/mcp/server.py", "server._lowlevel_server"): (
        "the mcp SDK's MCPServer has no public accessor for the low-level Server it runs"
    ),
    ("iac/integrations/mcp/server.py", "self.mcp._tool_manager"): (
        "the mcp SDK's MCPServer answers 'is this a tool?' only through its private ToolManager"
    ),
    ("iac/wire/identity.py", "signing_key._signing_key"): (
        "PyNaCl keeps the seed and public key only there; the fast signing path needs them"
    ),
}


def _is_own(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id in ("self", "cls")
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"


def foreign_private(source: str) -> list[str]:
    """Every ``x._name`` in ``source`` (dunders aside) where ``x`` is not this object."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute):
            continue
        name = node.attr
        dunder = name.startswith("__") and name.endswith("__")
        if name.startswith("_") and not dunder and not _is_own(node.value):
            out.append(ast.unparse(node))
    return out


@functools.cache
def private_accesses() -> Counter[tuple[str, str]]:
    """``(module, expression) -> count`` over ``iac/``, the adapter modules aside."""
    found: Counter[tuple[str, str]] = Counter()
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if GENERATED in path.parents or rel in ADAPTERS:
            continue
        for expr in foreign_private(path.read_text(encoding="utf-8")):
            found[(rel, expr)] += 1
    return found


def test_no_access_to_another_objects_private_members() -> None:
    found = private_accesses()
    bad = sorted(
        f"{module}: {expr} ({n}x)" for (module, expr), n in found.items() if (module, expr) not in ALLOWED
    )
    assert not bad, "private members of another object:\n" + "\n".join(bad)


def test_every_allowed_exception_is_still_needed() -> None:
    stale = sorted(
        f"{module}: {expr}" for module, expr in ALLOWED if (module, expr) not in private_accesses()
    )
    assert not stale, "allow-list entries no longer used:\n" + "\n".join(stale)


def test_the_check_sees_reads_writes_and_calls() -> None:
    source = "conn._error = None\nself._ok = 1\ncls._ok\nsuper()._ok()\nself.peer._bad()\nx.__class__\n"
    assert sorted(foreign_private(source)) == ["conn._error", "self.peer._bad"]
