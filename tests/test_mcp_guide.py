"""docs/guides/mcp.md: its Python example runs as written and prints what it says."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mcp")

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "guides" / "mcp.md"
_BLOCK = re.compile(r"<!-- example: ([\w-]+) -->\n```python\n(.*?)```", re.DOTALL)


def test_the_guide_example_runs(tmp_path):
    examples = dict(_BLOCK.findall(GUIDE.read_text()))
    assert set(examples) == {"mcp"}
    out = subprocess.run(
        [sys.executable, "-c", examples["mcp"]], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True", out.stdout
