"""The architecture, checked from the code: layers are folders, a layer imports only the layers
below it, no module imports another in a cycle, and the transport never verifies a message signature.
(Module length is a guideline in CONTRIBUTING.md, not a test.)

Every import counts: module level, inside functions, and under ``if TYPE_CHECKING:``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "iac"
GENERATED = PACKAGE / "wire" / "_pb"

#: Lowest first. A module may import its own layer and the layers of a lower rank; ``stores`` and
#: ``transport`` share a rank and do not import each other. ``testing`` may import anything, and
#: nothing in the package imports it but the benchmark suite (``bench``: its scenarios run on the
#: link emulator the chaos tests use). The top-level ``iac`` package (the public surface) and
#: ``iac.__main__`` sit above everything.
RANKS = {
    "errors": 0,
    "wire": 1,
    "protocol": 2,
    "stores": 3,
    "transport": 3,
    "node": 4,
    "conformance": 4,
    "mesh": 5,
    "integrations": 6,
    "demo": 7,
    "bench": 8,
    "cli": 9,
    "testing": 10,
}
TOP = 11
#: The benchmark suite's own layers (folders of ``iac/bench``) and what each may import of the suite:
#: the harness nothing else; contenders and reports the harness (reports read results files, never
#: a scenario or a contender); scenarios all three; the runner (``iac.bench``, ``iac.bench.main``,
#: ``iac.bench.__main__``) everything.
BENCH_LAYERS = {
    "harness": {"harness"},
    "contenders": {"harness", "contenders"},
    "reports": {"harness", "reports"},
    "scenarios": {"harness", "contenders", "reports", "scenarios"},
}


def modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        if GENERATED in path.parents:
            continue
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        yield ".".join(parts), path


MODULES = dict(modules())


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "iac"


def rank(module: str) -> int:
    if module in ("iac", "iac.__main__"):
        return TOP
    return RANKS[layer(module)]


def imported(module: str, path: Path) -> Iterator[tuple[str, int]]:
    """``(imported module, line)`` for every import of an ``iac`` module in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_package = path.name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "iac" or alias.name.startswith("iac."):
                    yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                if not is_package:
                    base = base[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target != "iac" and not target.startswith("iac."):
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                yield (sub if sub in MODULES else target), node.lineno


def edges() -> Iterator[tuple[str, str, int]]:
    for module, path in MODULES.items():
        for target, line in imported(module, path):
            yield module, target, line


def test_every_module_is_in_a_layer() -> None:
    unknown = sorted(m for m in MODULES if m not in ("iac", "iac.__main__") and layer(m) not in RANKS)
    assert not unknown, f"modules outside the layer folders: {unknown}"


def test_a_layer_imports_only_the_layers_below_it() -> None:
    bad = []
    for module, target, line in edges():
        if target.startswith("iac.wire._pb"):
            target = "iac.wire"
        if target not in MODULES and not target.startswith("iac.wire"):
            bad.append(f"{module}:{line} imports {target}, which is not a module of the package")
            continue
        if layer(target) == "testing" and layer(module) not in ("testing", "bench"):
            bad.append(f"{module}:{line} imports {target}: nothing in the package imports iac.testing")
            continue
        if layer(module) == layer(target) or rank(module) == TOP or layer(module) == "testing":
            continue
        if layer(module) == "bench" and layer(target) == "testing":
            continue
        if target == "iac" or rank(target) >= rank(module):
            bad.append(f"{module}:{line} ({layer(module)}) imports {target} ({layer(target)})")
    assert not bad, "layer violations:\n" + "\n".join(bad)


def bench_layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 3 and parts[1] == "bench" else None


def test_the_bench_layers_import_only_downward() -> None:
    assert {bench_layer(m) for m in MODULES if layer(m) == "bench"} - {None} == set(BENCH_LAYERS)
    bad = []
    for module, target, line in edges():
        below = BENCH_LAYERS.get(bench_layer(module) or "")
        if below is None or layer(target) != "bench":
            continue
        if bench_layer(target) not in below:
            bad.append(f"{module}:{line} ({bench_layer(module)}) imports {target}")
    assert not bad, "bench layer violations:\n" + "\n".join(bad)


def test_no_import_cycles() -> None:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for module, target, _ in edges():
        if target in graph and target != module:
            graph[module].add(target)
    cycles = _strongly_connected(graph)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(sorted(c)) for c in cycles)


def _strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm; the components with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[set[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


#: What opens or verifies a signed Message: the node's receive pipeline does that, never a transport.
MESSAGE_VERIFIERS = {"open_message", "decode_message_frame", "verify_signed"}


def test_the_transport_never_verifies_a_message_signature() -> None:
    bad = []
    for module, path in MODULES.items():
        if layer(module) != "transport":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.Attribute):
                names = [node.attr]
            elif isinstance(node, ast.Name):
                names = [node.id]
            bad += [f"{module}:{node.lineno} uses {n}" for n in names if n in MESSAGE_VERIFIERS]
    assert not bad, "\n".join(bad)


#: Where the repository keeps Python: no file there edits the import path (pytest's ``pythonpath``
#: puts the root on it for tests; tools run as ``python -m tools.x``; child processes get PYTHONPATH).
PYTHON_DIRS = ("iac", "tests", "tools", "benchmarks")


def test_nothing_in_the_repository_edits_sys_path() -> None:
    bad = []
    for top in PYTHON_DIRS:
        for path in sorted(p for p in (ROOT / top).rglob("*.py") if "node_modules" not in p.parts):
            text = path.read_text(encoding="utf-8")
            if "path" not in text or "sys" not in text:
                continue
            for node in ast.walk(ast.parse(text)):
                target = (
                    node.func.value
                    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    else None
                )
                if isinstance(node, (ast.Assign, ast.AugAssign)):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    target = next((t.value if isinstance(t, ast.Subscript) else t for t in targets), None)
                if (
                    isinstance(target, ast.Attribute)
                    and target.attr == "path"
                    and isinstance(target.value, ast.Name)
                    and target.value.id == "sys"
                ):
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not bad, "sys.path edited at: " + ", ".join(bad)
