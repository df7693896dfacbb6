"""Every README block marked ``<!-- example: NAME -->`` runs as written and passes ``mypy --strict``."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
_BLOCK = re.compile(r"<!-- example: ([\w-]+) -->\n```python\n(.*?)```", re.DOTALL)


#: What each example prints (a part of it).
EXPECTED = {
    "node": "{'summary': 'Q3 revenue g', 'has_deadline': True}",
    "call": "42",
    "streaming": "[0, 1, 2, 3]",
}


def examples() -> dict[str, str]:
    return dict(_BLOCK.findall(README.read_text()))


def test_readme_has_examples():
    assert {"node", "call", "streaming"} <= set(examples())


def test_every_example_has_its_expected_output():
    assert set(examples()) == set(EXPECTED)


@pytest.mark.parametrize("name", ["node", "call", "streaming"])
def test_node_examples_are_under_20_lines(name):
    lines = [line for line in examples()[name].splitlines() if line.strip()]
    assert len(lines) < 20, len(lines)


@pytest.mark.parametrize("name", sorted(examples()))
def test_readme_example_runs(name, tmp_path):
    code = examples()[name]
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert EXPECTED[name] in out.stdout, out.stdout


#: The headline rendered from a results file (tests/test_figures.py checks it); its renderer
#: writes it in lines of at most 100 characters too.
_RENDERED = re.compile(r"<!-- figures: [\w-]+ \([^)]*\) -->\n.*?<!-- /figures -->\n", re.DOTALL)


def test_readme_fits_300_lines_of_100_characters():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 300, len(text.splitlines())
    assert len(_RENDERED.findall(text)) == 1, "the one rendered headline"
    long = [(i, line) for i, line in enumerate(text.splitlines(), 1) if len(line) > 100]
    assert not long, long


def test_readme_examples_pass_mypy_strict(tmp_path):
    files = []
    for name, code in examples().items():
        path = tmp_path / f"readme_{name.replace('-', '_')}.py"
        path.write_text(code, encoding="utf-8")
        files.append(str(path))
    config = README.parent / "pyproject.toml"
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--config-file", str(config), *files],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=README.parent,
    )
    assert out.returncode == 0, out.stdout + out.stderr
