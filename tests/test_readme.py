"""Every README block marked ``<!-- example: NAME -->`` runs as written."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
_BLOCK = re.compile(r"<!-- example: ([\w-]+) -->\n```python\n(.*?)```", re.DOTALL)


def examples() -> dict[str, str]:
    return dict(_BLOCK.findall(README.read_text()))


def test_readme_has_examples():
    assert "codec" in examples()


@pytest.mark.parametrize("name", sorted(examples()))
def test_readme_example_runs(name, tmp_path):
    code = examples()[name]
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
