"""The API reference: generated from the code by mkdocs + mkdocstrings, and complete.

One ``mkdocs build --strict`` (warnings are errors: a broken link, a page left out of the
navigation, a name the handler cannot find) is shared by the assertions. Every name in the
``__all__`` of a public module must be in the built reference (its inventory, ``objects.inv``) and
have a docstring, read the way the reference reads it (griffe, statically, with the extensions of
mkdocs.yml: ``#:`` comments above attributes, the schema's comments for the protobuf classes).
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import griffe
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent

#: Packages under iac/ that are not library API: the command line, the demo and the benchmark suite
#: are programs (documented by ``--help``); integrations is a folder whose modules are each public.
NOT_LIBRARY = {"bench", "cli", "demo", "integrations"}


def public_modules() -> list[str]:
    """``iac``, each layer package, and each integration module or package."""
    found = ["iac"]
    for path in sorted((ROOT / "iac").iterdir()):
        if (path / "__init__.py").is_file() and path.name not in NOT_LIBRARY:
            found.append(f"iac.{path.name}")
    for path in sorted((ROOT / "iac" / "integrations").iterdir()):
        if path.name.startswith("_"):
            continue
        if path.suffix == ".py" or (path / "__init__.py").is_file():
            found.append(f"iac.integrations.{path.stem}")
    return found


def _inventory(path: Path) -> dict[str, str]:
    """Name -> role of each object in a Sphinx inventory (version 2, as mkdocstrings writes it)."""
    data = path.read_bytes()
    start = 0
    for _ in range(4):  # four header lines, then zlib
        start = data.index(b"\n", start) + 1
    out: dict[str, str] = {}
    for line in zlib.decompress(data[start:]).decode().splitlines():
        name, role, *_ = line.split(" ", 2)
        out[name] = role
    return out


@pytest.fixture(scope="module")
def inventory(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    site = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return _inventory(site / "objects.inv")


@pytest.fixture(scope="module")
def package() -> Any:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    (handler,) = [p["mkdocstrings"] for p in config["plugins"] if isinstance(p, dict) and "mkdocstrings" in p]
    names = handler["handlers"]["python"]["options"]["extensions"]
    extensions = griffe.load_extensions(*[str(ROOT / n) if n.endswith(".py") else n for n in names])
    loader = griffe.GriffeLoader(extensions=extensions, allow_inspection=False, search_paths=[str(ROOT)])
    pkg = loader.load("iac")
    loader.resolve_aliases(implicit=False, external=False)
    return pkg


def _exports() -> list[tuple[str, str]]:
    return [(m, name) for m in public_modules() for name in importlib.import_module(m).__all__]


def _path(m: str, name: str) -> str:
    """Where the reference documents ``m.name``: there, or, for a function that has the name of its
    own module (``iac.integrations.a2a.client``, which a static reader takes for the module),
    under the module's path."""
    obj = getattr(importlib.import_module(m), name)
    shadowed = callable(obj) and getattr(obj, "__module__", None) == f"{m}.{name}"
    return f"{m}.{name}.{name}" if shadowed else f"{m}.{name}"


def test_the_public_modules_are_the_layers_and_the_integrations() -> None:
    modules = public_modules()
    assert {"iac", "iac.errors", "iac.node", "iac.mesh", "iac.integrations.metrics"} <= set(modules)
    for m in modules:
        assert isinstance(importlib.import_module(m).__all__, list), f"{m} has no __all__"
    assert len(_exports()) > 250  # the whole surface, not a handful of names


def test_every_public_module_has_a_reference_page(inventory: dict[str, str]) -> None:
    pages = {name for name, role in inventory.items() if role == "py:module"}
    assert set(public_modules()) <= pages, sorted(set(public_modules()) - pages)


def test_every_exported_name_is_in_the_reference(inventory: dict[str, str]) -> None:
    missing = [_path(m, name) for m, name in _exports() if _path(m, name) not in inventory]
    assert not missing, f"not in the API reference: {missing}"


def test_every_exported_name_has_a_docstring(package: Any) -> None:
    undocumented = []
    for m, name in _exports():
        doc = package[_path(m, name).removeprefix("iac.")].docstring
        if doc is None or not doc.value.strip():
            undocumented.append(f"{m}.{name}")
    assert not undocumented, f"no docstring: {undocumented}"


def test_a_method_of_node_shows_its_signature_and_docstring(inventory: dict[str, str], package: Any) -> None:
    assert inventory.get("iac.Node.send") == "py:method"
    assert inventory.get("iac.Node.stream") == "py:method"
    assert "peer" in [p.name for p in package["Node"].members["send"].parameters]
