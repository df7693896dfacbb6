"""The node is composed, not wired: a :class:`~iac.Node` holds its runtime (it does not subclass it)
and keeps the public surface it had; the runtime builds each collaborator with what it needs in
its constructor, never by assigning another object's attributes afterwards."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import iac.node.node
import iac.node.runtime
from iac.node import Node, Paths
from iac.node.runtime import NodeRuntime

#: The public names of ``Node`` (methods, properties, and attributes of an instance).
PUBLIC = {
    "add_peer", "add_route", "agent_id", "broadcast", "call", "close", "connect", "connected",
    "connection", "count_short_broadcast", "delegate", "expose", "exposed", "handler", "invoke",
    "keep_connected", "observe", "on", "on_error", "on_file", "on_peer", "paths", "peer_book",
    "peer_events", "peer_links", "peer_state", "peers", "remove_route", "request", "routes", "send",
    "send_file", "start", "stats", "stop_keeping", "stream",
    # attributes of an instance
    "addresses", "clock", "config", "identity", "nat_stats",
}  # fmt: skip


def test_node_holds_its_runtime_and_keeps_its_public_surface() -> None:
    assert NodeRuntime not in Node.__mro__
    node = Node()
    names = {n for n in dir(node) if not n.startswith("_")}
    assert names == PUBLIC
    for dunder in ("__aenter__", "__aexit__", "__repr__"):
        assert dunder in vars(Node)
    assert isinstance(node.paths, Paths)
    assert node.paths.quic_listener() is None and not node.paths.relayed("ab" * 32)


def wiring(source: str, cls: str) -> list[str]:
    """Assignments in ``cls.__init__`` to an attribute of anything but ``self`` itself."""
    tree = ast.parse(source)
    init = next(
        f
        for c in tree.body
        if isinstance(c, ast.ClassDef) and c.name == cls
        for f in c.body
        if isinstance(f, ast.FunctionDef) and f.name == "__init__"
    )
    found = []
    for node in ast.walk(init):
        targets: list[ast.expr] = list(node.targets) if isinstance(node, ast.Assign) else []
        if isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        for t in targets:
            for leaf in t.elts if isinstance(t, ast.Tuple) else [t]:
                if isinstance(leaf, ast.Attribute) and not (
                    isinstance(leaf.value, ast.Name) and leaf.value.id == "self"
                ):
                    found.append(ast.unparse(leaf))
    return found


def _source(module: object) -> str:
    return Path(inspect.getfile(module)).read_text(encoding="utf-8")  # type: ignore[arg-type]


def test_collaborators_are_built_not_wired() -> None:
    assert wiring(_source(iac.node.runtime), "NodeRuntime") == []
    assert wiring(_source(iac.node.node), "Node") == []


def test_the_wiring_check_sees_an_assignment() -> None:
    source = (
        "class A:\n    def __init__(self):\n        self.x = 1\n        self.x.y = 2\n"
        "        a.b, c = 1, 2\n        self.p.q += 1\n"
    )
    assert wiring(source, "A") == ["self.x.y", "a.b", "self.p.q"]
